// The CUDA reduction kernels (see kernels.h). Where all three buffers are 16-byte aligned (XLA's
// buffers are, and so are the pipeline's chunks of a power-of-two size) a grid-stride loop
// moves 16 bytes per thread and load (16 / sizeof(T) elements), the tail element by element;
// otherwise every thread handles kUnroll elements a blockDim apart so loads coalesce. No FMA
// contraction can occur: every operation is a single IEEE op (and the build passes -fmad=false).
#include "cuda/kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "coll/reduce_ops.h"

namespace r2ccl::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <class T, class Op>
__global__ void reduce_kernel(T* out, const T* a, const T* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * kUnroll;
  for (size_t base = (static_cast<size_t>(blockIdx.x) * blockDim.x) * kUnroll + threadIdx.x; base < n;
       base += stride) {
    T x[kUnroll], y[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; k++) {
      const size_t i = base + static_cast<size_t>(k) * blockDim.x;
      if (i < n) {
        x[k] = a[i];
        y[k] = b[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; k++) {
      const size_t i = base + static_cast<size_t>(k) * blockDim.x;
      if (i < n) out[i] = Op::apply(x[k], y[k]);
    }
  }
}

template <class T, class Op>
__global__ void reduce_vec_kernel(uint4* out, const uint4* a, const uint4* b, size_t nvec) {
  constexpr int V = static_cast<int>(sizeof(uint4) / sizeof(T));
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += stride) {
    const uint4 x = a[i], y = b[i];
    T xs[V], ys[V], rs[V];
    memcpy(xs, &x, sizeof x);
    memcpy(ys, &y, sizeof y);
#pragma unroll
    for (int k = 0; k < V; k++) rs[k] = Op::apply(xs[k], ys[k]);
    uint4 r;
    memcpy(&r, rs, sizeof r);
    out[i] = r;
  }
}

template <class T, class Op>
__global__ void reduce_2d_kernel(T* out, size_t po, const T* a, size_t pa, const T* b, size_t pb, size_t w,
                                 size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t r = i / w, col = i - r * w;
    out[r * po + col] = Op::apply(a[r * pa + col], b[r * pb + col]);
  }
}

unsigned blocks_for(size_t n, size_t per_block) {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 80;
  const size_t want = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(want, 8u * static_cast<unsigned>(sms))));
}

struct Launch2d {
  void* out;
  size_t po;
  const void* a;
  size_t pa;
  const void* b;
  size_t pb;
  size_t w, rows;
  cudaStream_t stream;
  cudaError_t status = cudaSuccess;
  template <class T, class Op>
  void run() {
    const size_t n = w * rows;
    reduce_2d_kernel<T, Op><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), po, static_cast<const T*>(a), pa, static_cast<const T*>(b), pb, w, n);
    status = cudaGetLastError();
  }
};

struct Launch {
  void* out;
  const void* a;
  const void* b;
  size_t n;
  cudaStream_t stream;
  cudaError_t status = cudaSuccess;
  template <class T, class Op>
  void run() {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(uint4) == 0; };
    size_t done = 0;
    if (aligned(out) && aligned(a) && aligned(b)) {
      const size_t nvec = n * sizeof(T) / sizeof(uint4);
      if (nvec > 0) {
        reduce_vec_kernel<T, Op><<<blocks_for(nvec, kThreads), kThreads, 0, stream>>>(
            static_cast<uint4*>(out), static_cast<const uint4*>(a), static_cast<const uint4*>(b), nvec);
        status = cudaGetLastError();
        if (status != cudaSuccess) return;
      }
      done = nvec * sizeof(uint4) / sizeof(T);
    }
    if (done == n) return;
    const size_t rest = n - done;
    const unsigned blocks = blocks_for(rest, static_cast<size_t>(kThreads) * kUnroll);
    reduce_kernel<T, Op><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out) + done,
                                                          static_cast<const T*>(a) + done,
                                                          static_cast<const T*>(b) + done, rest);
    status = cudaGetLastError();
  }
};

}  // namespace

cudaError_t reduce(coll::DType t, coll::ReduceOp op, void* out, const void* a, const void* b, size_t count,
                   cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  Launch l{out, a, b, count, stream};
  if (!coll::ops::dispatch(t, op, l)) return cudaErrorInvalidValue;
  return l.status;
}

cudaError_t reduce_2d(coll::DType t, coll::ReduceOp op, void* out, size_t out_pitch, const void* a, size_t a_pitch,
                      const void* b, size_t b_pitch, size_t width, size_t rows, cudaStream_t stream) {
  if (width == 0 || rows == 0) return cudaSuccess;
  if (rows == 1) return reduce(t, op, out, a, b, width, stream);
  Launch2d l{out, out_pitch, a, a_pitch, b, b_pitch, width, rows, stream};
  if (!coll::ops::dispatch(t, op, l)) return cudaErrorInvalidValue;
  return l.status;
}

}  // namespace r2ccl::cuda
