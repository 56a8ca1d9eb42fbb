#ifndef PS_KERNELS_CONV_CUDA_H_
#define PS_KERNELS_CONV_CUDA_H_

// CUDA launchers behind conv.h: the data movement around cuBLAS's GEMMs
// (im2col, col2im, NCHW <-> [channel x pixel] blocks, bias). Each queues one
// kernel on `stream` and returns the launch error (cudaSuccess when queued).
// Pointers are device memory of the GPU current on the calling thread.
//
// A "block" is `count` consecutive samples. Its columns are a
// [C*KH*KW] x [count*OH*OW] row-major matrix: row (c, i, j) holds, for each
// sample and output pixel, the input under kernel tap (i, j) of channel c (0
// in the padding). Its channel matrix is [channels] x [count*OH*OW]: sample s
// occupies columns [s*OH*OW, (s+1)*OH*OW) of each row.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ps::kernels::internal {

// The convolution's geometry in elements (see Conv2dShape), without abseil
// so that nvcc can see it.
struct ConvGeometry {
  int64_t in_channels, height, width;
  int64_t out_channels, kernel_h, kernel_w;
  int64_t stride_h, stride_w, pad_h, pad_w;
  int64_t out_height, out_width;
};

// x: `count` NCHW samples -> cols (the block's columns).
cudaError_t Im2ColCuda(cudaStream_t stream, const ConvGeometry& g, int64_t count, const float* x,
                       float* cols);

// The adjoint: dx (`count` NCHW samples) = the sums of each input element's
// entries in cols. Overwrites dx.
cudaError_t Col2ImCuda(cudaStream_t stream, const ConvGeometry& g, int64_t count, const float* cols,
                       float* dx);

// y (`count` samples of [channels, pixels]) = the channel matrix `block`
// plus bias[channel] (bias may be null). With count == 1 the two layouts are
// the same and block may equal y.
cudaError_t BlockToNchwCuda(cudaStream_t stream, int64_t count, int64_t channels, int64_t pixels,
                            const float* block, const float* bias, float* y);

// The channel matrix `block` of `count` samples of y ([channels, pixels]).
cudaError_t NchwToBlockCuda(cudaStream_t stream, int64_t count, int64_t channels, int64_t pixels,
                            const float* y, float* block);

// sums[r] = (accumulate ? sums[r] : 0) + sum of row r of the rows x cols
// row-major matrix m. One thread block per row; deterministic.
cudaError_t RowSumsCuda(cudaStream_t stream, int64_t rows, int64_t cols, const float* m,
                        bool accumulate, float* sums);

}  // namespace ps::kernels::internal

#endif  // PS_KERNELS_CONV_CUDA_H_
