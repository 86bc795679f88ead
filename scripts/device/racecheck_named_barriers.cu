// compute-sanitizer racecheck on a race-free kernel with named barriers (session 25, H100, CUDA 13.0):
// 8 warps; pair (w, w + 4) runs steps[w] steps of a loop with its own named barrier (3 + w, 64
// threads), as the paired attention decode blocks do (attention.cu, pair_sync), then the block meets at
// __syncthreads, warp 2 overwrites the region pair 0 read, and threads read each other's results
// behind a second __syncthreads. Every access is ordered by the PTX barrier rules, yet racecheck
// reports a RAW hazard across the second __syncthreads when pair 0 runs 1 step and the others 0, or
// 2 and 1 (not for 2/0 or 1/1):
//   nvcc -O2 -arch=sm_90 -lineinfo -o /tmp/rc scripts/device/racecheck_named_barriers.cu
//   compute-sanitizer --tool racecheck /tmp/rc 1 0   # "Race reported between Write ... and Read ..."
// So racecheck's hazards in attention_decode_mma_kernel<..., 2> (AttentionVerifyRowsEqualDecodeSteps:
// 41-60 of them, at accesses a __syncthreads or a set's named barrier orders) say nothing; the one-set
// blocks (HYSPEC_ATTN_PAIRS=0) and memcheck are clean. Arguments: pair 0's steps, the others' steps.
#include <cstdio>
#include <cstdlib>
__device__ __forceinline__ void pair_sync(int w) {
  switch (w) {
    case 0: asm volatile("barrier.sync 3, 64;" ::: "memory"); break;
    case 1: asm volatile("barrier.sync 4, 64;" ::: "memory"); break;
    case 2: asm volatile("barrier.sync 5, 64;" ::: "memory"); break;
    default: asm volatile("barrier.sync 6, 64;" ::: "memory"); break;
  }
}
__global__ void k(float* out, int steps0, int steps_rest) {
  __shared__ float stage[4][64];
  __shared__ float res[256];
  const int set = threadIdx.x / 128, tid = threadIdx.x % 128, w = tid / 32, lane = tid % 32;
  const int steps = w == 0 ? steps0 : steps_rest;
  float acc = 0.0f;
  for (int s = 0; s < steps; ++s) {
    stage[w][set * 32 + lane] = s + lane;  // each half of the pair writes its half
    pair_sync(w);
    acc += stage[w][(1 - set) * 32 + lane];  // and reads the partner's
    pair_sync(w);
  }
  __syncthreads();
  if (w == 2) reinterpret_cast<float*>(stage)[set * 32 + lane] = acc;  // over pair 0's stage
  res[threadIdx.x] = acc;
  __syncthreads();
  out[threadIdx.x] = res[255 - threadIdx.x] + reinterpret_cast<float*>(stage)[lane];
}
int main(int argc, char** argv) {
  const int s0 = argc > 1 ? atoi(argv[1]) : 1, sr = argc > 2 ? atoi(argv[2]) : 0;
  float* d;
  cudaMalloc(&d, 256 * sizeof(float));
  k<<<2, 256>>>(d, s0, sr);
  float h[256];
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  printf("racecheck_named_barriers: steps %d/%d: out[0]=%g (%s)\n", s0, sr, h[0], cudaGetErrorString(cudaGetLastError()));
  return 0;
}
