#include "worker/model/model_profile.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace ps::worker::model {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kFormat = "ps-model-profile";
constexpr int64_t kVersion = 1;

const std::vector<std::pair<std::string, int64_t>>& DTypes() {
  // model_profile.py's DTYPE_BYTES, in its order (the error lists them).
  static const auto* dtypes = new std::vector<std::pair<std::string, int64_t>>{
      {"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8}, {"int64", 8},
      {"int32", 4},   {"int16", 2},   {"int8", 1},     {"uint8", 1},   {"bool", 1}};
  return *dtypes;
}

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

std::string Sub(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

// Every field of `allowed` not in `optional` present, and no other.
absl::Status Fields(const Json& obj, const std::string& path, const std::set<std::string>& allowed,
                    const std::set<std::string>& optional = {}) {
  if (!obj.is_object()) {
    return Bad(path.empty() ? "(profile)" : path,
               absl::StrCat("must be a JSON object, not ", obj.type_name()));
  }
  for (const std::string& key : allowed) {
    if (optional.count(key) == 0 && !obj.contains(key)) return Bad(Sub(path, key), "missing");
  }
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (allowed.count(it.key()) == 0) {
      return Bad(Sub(path, it.key()),
                 absl::StrCat("unknown field (known: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> String(const Json& value, const std::string& path) {
  if (!value.is_string() || value.get<std::string>().empty()) {
    return Bad(path, absl::StrCat("must be a non-empty string, not ", value.dump()));
  }
  return value.get<std::string>();
}

absl::StatusOr<int64_t> Integer(const Json& value, const std::string& path, int64_t least) {
  if (!value.is_number_integer()) {
    return Bad(path, absl::StrCat("must be an integer, not ", value.dump()));
  }
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX}) {
    return Bad(path, absl::StrCat(value.dump(), " overflows int64"));
  }
  const int64_t v = value.get<int64_t>();
  if (v < least) return Bad(path, absl::StrCat(v, " is below ", least));
  return v;
}

absl::StatusOr<double> TimeMs(const Json& value, const std::string& path) {
  if (!value.is_number()) {
    return Bad(path, absl::StrCat("must be a number of milliseconds, not ", value.dump()));
  }
  const double v = value.get<double>();
  if (!std::isfinite(v)) return Bad(path, absl::StrCat(v, " is not finite"));
  if (v < 0) return Bad(path, absl::StrCat(v, " is negative"));
  if (v > kMaxProfileMs) return Bad(path, absl::StrCat(v, " ms is more than a day"));
  return v;
}

absl::Status ParseMeasured(const Json& m, ModelProfile::Measured* out) {
  PS_RETURN_IF_ERROR(Fields(m, "measured",
                            {"where", "date", "cpu", "cores", "threads", "software", "steps",
                             "warmup_steps", "statistic", "note"},
                            {"note"}));
  PS_ASSIGN_OR_RETURN(out->where, String(m["where"], "measured.where"));
  PS_ASSIGN_OR_RETURN(out->date, String(m["date"], "measured.date"));
  PS_ASSIGN_OR_RETURN(out->cpu, String(m["cpu"], "measured.cpu"));
  PS_ASSIGN_OR_RETURN(out->statistic, String(m["statistic"], "measured.statistic"));
  PS_ASSIGN_OR_RETURN(out->cores, Integer(m["cores"], "measured.cores", 1));
  PS_ASSIGN_OR_RETURN(out->threads, Integer(m["threads"], "measured.threads", 1));
  PS_ASSIGN_OR_RETURN(out->steps, Integer(m["steps"], "measured.steps", 1));
  PS_ASSIGN_OR_RETURN(out->warmup_steps, Integer(m["warmup_steps"], "measured.warmup_steps", 0));
  if (m.contains("note")) {
    PS_ASSIGN_OR_RETURN(out->note, String(m["note"], "measured.note"));
  }
  const Json& software = m["software"];
  if (!software.is_object() || software.empty()) {
    return Bad("measured.software", "must be an object of name -> version");
  }
  for (auto it = software.begin(); it != software.end(); ++it) {
    PS_ASSIGN_OR_RETURN(out->software[it.key()],
                        String(it.value(), absl::StrCat("measured.software.", it.key())));
  }
  return absl::OkStatus();
}

// The tensors, with their names' indices in `index`.
absl::Status ParseTensors(const Json& tensors, ModelProfile* out,
                          absl::flat_hash_map<std::string, size_t>* index) {
  if (!tensors.is_array() || tensors.empty()) return Bad("tensors", "must be a non-empty list");
  int64_t total = 0;  // bytes; each tensor's is bounded, so the sum cannot overflow first
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Json& t = tensors[i];
    const std::string path = absl::StrCat("tensors[", i, "]");
    PS_RETURN_IF_ERROR(Fields(t, path, {"name", "shape", "dtype"}));
    ModelProfile::TensorEntry entry;
    PS_ASSIGN_OR_RETURN(entry.name, String(t["name"], path + ".name"));
    if (auto [it, fresh] = index->emplace(entry.name, i); !fresh) {
      return Bad(path + ".name",
                 absl::StrCat("'", entry.name, "' repeats tensors[", it->second, "]"));
    }
    entry.dtype = t["dtype"].is_string() ? t["dtype"].get<std::string>() : t["dtype"].dump();
    const int64_t element_bytes = ProfileDTypeBytes(entry.dtype);
    if (element_bytes == 0) {
      std::vector<std::string> known;
      for (const auto& [name, bytes] : DTypes()) known.push_back(name);
      return Bad(path + ".dtype", absl::StrCat("unknown dtype '", entry.dtype,
                                               "' (known: ", absl::StrJoin(known, ", "), ")"));
    }
    const Json& shape = t["shape"];
    if (!shape.is_array()) {
      return Bad(path + ".shape", absl::StrCat("must be a list of sizes, not ", shape.dump()));
    }
    int64_t elements = 1;
    bool overflow = false;
    for (size_t j = 0; j < shape.size(); ++j) {
      PS_ASSIGN_OR_RETURN(int64_t size,
                          Integer(shape[j], absl::StrCat(path, ".shape[", j, "]"), 1));
      entry.shape.push_back(size);
      overflow = overflow || __builtin_mul_overflow(elements, size, &elements);
    }
    if (overflow) return Bad(path + ".shape", "its elements overflow int64");
    if (elements > kMaxProfileTensorBytes / element_bytes) {
      return Bad(path + ".shape", absl::StrCat(elements, " elements of ", element_bytes,
                                               " bytes exceed the bound of ",
                                               kMaxProfileTensorBytes, " bytes for one tensor"));
    }
    total += elements * element_bytes;
    if (total > kMaxProfileModelBytes) {
      return Bad("tensors", absl::StrCat("more than ", kMaxProfileModelBytes,
                                         " bytes in all exceed the bound"));
    }
    out->tensors.push_back(std::move(entry));
  }
  return absl::OkStatus();
}

absl::Status ParseLayers(const Json& layers, const absl::flat_hash_map<std::string, size_t>& index,
                         ModelProfile* out) {
  if (!layers.is_array() || layers.empty()) return Bad("layers", "must be a non-empty list");
  absl::flat_hash_map<std::string, size_t> owner;
  std::set<std::string> names;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Json& l = layers[i];
    const std::string path = absl::StrCat("layers[", i, "]");
    PS_RETURN_IF_ERROR(Fields(l, path, {"name", "tensors", "forward_ms", "backward_ms"}));
    ModelProfile::Layer layer;
    PS_ASSIGN_OR_RETURN(layer.name, String(l["name"], path + ".name"));
    if (!names.insert(layer.name).second) {
      return Bad(path + ".name", absl::StrCat("'", layer.name, "' repeats"));
    }
    PS_ASSIGN_OR_RETURN(layer.forward_ms, TimeMs(l["forward_ms"], path + ".forward_ms"));
    PS_ASSIGN_OR_RETURN(layer.backward_ms, TimeMs(l["backward_ms"], path + ".backward_ms"));
    const Json& tensors = l["tensors"];
    if (!tensors.is_array() || tensors.empty()) {
      return Bad(path + ".tensors", "must be a non-empty list of tensor names");
    }
    for (size_t j = 0; j < tensors.size(); ++j) {
      const std::string field = absl::StrCat(path, ".tensors[", j, "]");
      const std::string name =
          tensors[j].is_string() ? tensors[j].get<std::string>() : tensors[j].dump();
      if (index.count(name) == 0) return Bad(field, absl::StrCat("'", name, "' is not in tensors"));
      if (auto [it, fresh] = owner.emplace(name, i); !fresh) {
        return Bad(field, absl::StrCat("'", name, "' is layers[", it->second, "]'s too"));
      }
      layer.tensors.push_back(name);
    }
    out->layers.push_back(std::move(layer));
  }
  for (size_t i = 0; i < out->tensors.size(); ++i) {
    if (owner.count(out->tensors[i].name) == 0) {
      return Bad(absl::StrCat("tensors[", i, "]"),
                 absl::StrCat("'", out->tensors[i].name,
                              "' is in no layer: the layers must cover every tensor"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t ProfileDTypeBytes(const std::string& dtype) {
  for (const auto& [name, bytes] : DTypes()) {
    if (name == dtype) return bytes;
  }
  return 0;
}

absl::StatusOr<ModelProfile> ParseModelProfile(const std::string& json) {
  Json doc;
  try {
    doc = Json::parse(json);
  } catch (const Json::exception& e) {
    return Bad("(file)", absl::StrCat("not JSON: ", e.what()));
  }
  PS_RETURN_IF_ERROR(Fields(doc, "",
                            {"format", "version", "model", "batch_size", "measured", "tensors",
                             "layers", "input", "totals"},
                            {"input", "totals"}));
  ModelProfile out;
  if (doc["format"] != kFormat) {
    return Bad("format", absl::StrCat("is ", doc["format"].dump(), ", not '", kFormat, "'"));
  }
  if (!doc["version"].is_number_integer() || doc["version"].get<int64_t>() != kVersion) {
    return Bad("version", absl::StrCat(doc["version"].dump(),
                                       " is not a version this reader knows (", kVersion, ")"));
  }
  PS_ASSIGN_OR_RETURN(out.model, String(doc["model"], "model"));
  PS_ASSIGN_OR_RETURN(out.batch_size, Integer(doc["batch_size"], "batch_size", 1));
  if (doc.contains("input")) {
    PS_ASSIGN_OR_RETURN(out.input, String(doc["input"], "input"));
  }
  PS_RETURN_IF_ERROR(ParseMeasured(doc["measured"], &out.measured));
  absl::flat_hash_map<std::string, size_t> index;
  PS_RETURN_IF_ERROR(ParseTensors(doc["tensors"], &out, &index));
  PS_RETURN_IF_ERROR(ParseLayers(doc["layers"], index, &out));
  if (doc.contains("totals")) {
    const Json& totals = doc["totals"];
    PS_RETURN_IF_ERROR(Fields(totals, "totals", {"forward_ms", "backward_ms"}));
    PS_ASSIGN_OR_RETURN(out.total_forward_ms, TimeMs(totals["forward_ms"], "totals.forward_ms"));
    PS_ASSIGN_OR_RETURN(out.total_backward_ms, TimeMs(totals["backward_ms"], "totals.backward_ms"));
  }
  return out;
}

absl::StatusOr<ModelProfile> ReadModelProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read model profile ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ModelProfile> profile = ParseModelProfile(text.str());
  if (!profile.ok()) {
    return absl::Status(profile.status().code(),
                        absl::StrCat("model profile ", path, ": ", profile.status().message()));
  }
  return profile;
}

std::string ModelProfileToJson(const ModelProfile& p) {
  Json doc;
  doc["format"] = kFormat;
  doc["version"] = kVersion;
  doc["model"] = p.model;
  doc["batch_size"] = p.batch_size;
  if (!p.input.empty()) doc["input"] = p.input;
  Json& m = doc["measured"];
  m["where"] = p.measured.where;
  m["date"] = p.measured.date;
  m["cpu"] = p.measured.cpu;
  m["cores"] = p.measured.cores;
  m["threads"] = p.measured.threads;
  m["software"] = Json::object();
  for (const auto& [name, version] : p.measured.software) m["software"][name] = version;
  m["steps"] = p.measured.steps;
  m["warmup_steps"] = p.measured.warmup_steps;
  m["statistic"] = p.measured.statistic;
  if (!p.measured.note.empty()) m["note"] = p.measured.note;
  doc["tensors"] = Json::array();
  for (const ModelProfile::TensorEntry& t : p.tensors) {
    doc["tensors"].push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", t.dtype}});
  }
  doc["layers"] = Json::array();
  for (const ModelProfile::Layer& l : p.layers) {
    doc["layers"].push_back({{"name", l.name},
                             {"tensors", l.tensors},
                             {"forward_ms", l.forward_ms},
                             {"backward_ms", l.backward_ms}});
  }
  if (p.total_forward_ms >= 0 && p.total_backward_ms >= 0) {
    doc["totals"] = {{"forward_ms", p.total_forward_ms}, {"backward_ms", p.total_backward_ms}};
  }
  return doc.dump(1) + "\n";
}

absl::Status WriteModelProfile(const ModelProfile& profile, const std::string& path) {
  std::ofstream out(path);
  out << ModelProfileToJson(profile);
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write model profile to ", path));
  return absl::OkStatus();
}

}  // namespace ps::worker::model
