#ifndef PS_COMMON_RNG_H_
#define PS_COMMON_RNG_H_

// The one random number generator of the codebase, whose output is fixed by
// its definition, so that parameter initialisation, data order and synthetic
// data are identical on every machine, compiler and standard library.
// (std::uniform_int_distribution and friends are implementation-defined and
// would let two workers disagree on an epoch.) worker/model/torch_models.py
// has a Python twin that produces the same values; rng_test.cc pins both.

#include <cstdint>

namespace ps {

// SplitMix64's output function: a bijective 64-bit mixer.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A seed for stream `stream` of `seed` (e.g. an epoch of a shuffle seed).
// Distinct (seed, stream) pairs give unrelated streams.
inline uint64_t MixSeed(uint64_t seed, uint64_t stream) {
  return Mix64(seed ^ Mix64(stream + 0x632be59bd9b4e019ULL));
}

// Sebastiano Vigna's SplitMix64 (public domain). Not thread-safe; cheap to
// copy. Not for cryptography.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() { return Mix64(state_ += 0x9e3779b97f4a7c15ULL); }

  // Uniform in [0, n) without modulo bias (rejection sampling); n >= 1.
  uint64_t Below(uint64_t n) {
    // 2^64 mod n: values below it would make the low residues more likely.
    const uint64_t threshold = (0 - n) % n;
    while (true) {
      const uint64_t r = Next();
      if (r >= threshold) return r % n;
    }
  }

  // Uniform in [0, 1): the top 24 bits of one draw times 2^-24 (exact in a
  // float).
  float NextFloat() { return static_cast<float>(Next() >> 40) * 0x1.0p-24f; }

 private:
  uint64_t state_;
};

}  // namespace ps

#endif  // PS_COMMON_RNG_H_
