// Integer-dot matvec for Q4_K, Q5_K, Q6_K, Q3_K and IQ4_XS weights at decode and verify widths (1..32
// tokens): the default for those types (BackendOptions::int8_matvec; `--f16-matvec` turns it off).
//
// The f16 tensor-core matvec (matmul.cu) turns every code into an f16 fragment and stalls at ~1.4
// TB/s for one token on an H100. Here the codes stay integers, as in llama.cpp's CPU q4_K/q6_K x q8_K
// dots: activations are quantized to int8 in blocks of 256, one scale dx per block plus the exact sum
// of every 16 codes (q8k.cuh: by quantize_q8k_kernel, by the norm that wrote x, or in-block). A
// super-block of 256 weights then adds to an output
//   Q4_K, Q5_K (8 sub-blocks of 32 codes 0..15 / 0..31, 6-bit scale sc and min m, f16 d and dmin):
//     dx * (d * isum - dmin * msum),  isum = sum_i sc_i * dot_i,  msum = sum_i m_i * bsum_i
//   Q6_K, Q3_K, IQ4_XS (16 sub-blocks of 16 codes, int8 scale sc, f16 d; codes minus 32, 4 or 0):
//     dx * d * (isum - off * msum),   isum = sum_j sc_j * dot_j,  msum = sum_j sc_j * bsum_j
// with exact integers and one float rounding sequence per super-block (`add_super_block`,
// `add_s16_super_block`). One or two tokens: a lane owns half a super-block of one weight row and
// forms dot with dp4a (4 MACs per instruction) against x staged in shared memory. Three or more: an
// int8 mma (m16n8k32 per Q4_K/Q5_K sub-block, m16n8k16 per 16-code one) forms the dots of 16 rows and 8 tokens,
// and one f16 mma.m16n8k16 per super-block forms msum (small integers: the f32 result is exact).
// Integers are exact and the float sequence is the same, so every width gives the one-token bits:
// speculative verify rows equal decode steps.
//
// Layout: a block of 8 warps owns a tile of 16 rows at a time (8 gate + 8 up rows for the fused
// SwiGLU); warp ks takes the super-blocks (steps) ks, ks + 8, ... of the tile's rows, streamed
// through a private double-buffered cp.async ring of 16 rows' blocks (Q4KLayout, Q6KLayout); on sm_90 the
// Q4_K kernels' ring and Q6_K's tensor-core kernels' are fed by one TMA box a step instead (TmaStepRing;
// session 52: decode -1.5%, verify-15 -4.5%). The
// warps are summed in a fixed order, so a row's result is the same bits whatever the number of
// tokens, and the same in the fused SwiGLU as in a plain call. Several matvecs of one input (a
// layer's q/k/v, a Q6_K and a Q4_K run of stacked projections) may share one launch (multi_kernel):
// each gets a share of the blocks by its bytes, and its rows the bits of a launch of its own.
// A one-row launch may also run the decode step's depthwise conv (kernel 4) + SiLU on its first outputs
// in the tiles' epilogue (Int8ConvFold: + 3 state reads and writes, 4 weights and one output per channel),
// which saves the conv's launch (session 31: 9B decode -2%); so may a multi launch of up to 24 rows, a verify
// step's (write_tile_conv: + each token's capture window; session 48: verify -0.3..-1% at 2, 5 and 17 rows,
// +0.2% at 16). And a one-row launch may stage x through the
// op that wrote it (Int8XFold: a GDN layer's gated norm, an attention layer's sigmoid gate), or, past
// kInBlockMaxK inputs, in rounds of blocks (kPlain: the FFN down projection) instead of after a quantize
// launch; or through the RMS norm of the row (kRmsNorm: a decode step's add_rms_norm, whose residual add the
// launch before did as it stored its outputs, Int8MvArgs::residual), which saves the norm's launch and its
// grid hop (session 45: 9B Q4_K_M decode -5.6% on the H200, 2.13 -> 2.01 ms). Every staging path issues its
// loads before its first store into shared memory, where a store in between can keep the next load behind it
// (session 32: so staged, the copy of a norm's codes, sums and scales took a 9B decode step from 2.61 to 2.57
// ms on an H100).
// Bytes per call: W once + n*K*(1 + 1/8 + 1/64) (int8 x, 16-element sums, scales: in shared memory for
// dp4a, from L1/L2 per tile for mma) + n*n_out*4. Instructions per Q4_K super-block and 16 rows
// (ncu, SASS executed per warp-step, 4096 x 12288): ~356 at one token, ~567 at 17 tokens. H100, one
// token: 2.1-2.3 TB/s on 4096 x 8192..12288 (f16 matvec 1.3-1.5); 17 tokens 1.3-1.5 (Q4_K), 1.4-1.6 (Q6_K).
#include <cuda_fp16.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "backend/cuda/activations.cuh"
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch_util.h"
#include "backend/cuda/q8k.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace hyspec::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;  // weight rows per tile

// A ring slot row per weight type. Q4_K blocks are 9 x 16 bytes: rows and steps stay 16-byte aligned
// (and 8 lanes reading 16 bytes of 8 rows hit distinct banks). Q6_K blocks (210 bytes) start at any
// even address: a row's slot holds the 16-byte aligned cover of its block (<= 14 pieces), which keeps
// the bytes' address mod 16, and is read at that offset.
// An unaligned block's cover takes up to (kBlockBytes + 14) / 16 rounded up pieces; its slot one piece
// more, so that the 16 rows of a slot do not all start in the same banks.
template <int kBytes>
struct BlockLayout {
  static constexpr int kBlockBytes = kBytes;
  static constexpr bool kAligned = kBytes % 16 == 0;
  static constexpr int kPieces = kAligned ? kBytes / 16 : (kBytes + 14 + 15) / 16;  // cp.async copies per row
  static constexpr int kSlotBytes = kAligned ? kBytes : 16 * (kPieces + 1);
};
using Q4KLayout = BlockLayout<144>;  // d, dmin (f16), scales[12], qs[128]
// Q5_K: Q4_K's header and codes plus qh[32] (bit j of qh[l]: the fifth bit of element l of sub-block j).
using Q5KLayout = BlockLayout<176>;  // d, dmin (f16), scales[12], qh[32], qs[128]
using Q6KLayout = BlockLayout<210>;  // ql[128], qh[64], scales[16] (int8), d (f16)
static_assert(Q6KLayout::kPieces == 14 && Q6KLayout::kSlotBytes == 240);

// The activations of n tokens as Q8K (q8k.cuh) of pitch padded_tokens(n). quantize_q8k_kernel writes the
// rows past n as zeros; rows quantized by a norm (QuantizedX) hold earlier rows' codes there instead,
// which is as good: a padding token's codes only reach its own outputs, which are never written.

// A warp's 256 values (lane l: elements 8l..8l+7) -> q (stored in `order`), its 16-element code sums and
// its scale.
__device__ __forceinline__ void quantize_values(const float (&v)[8], int lane, int8_t* q, __half* bs, float* d_out,
                                                XOrder order) {
  const Q8KLane r = quantize_lane(v);
  store_codes(r, lane, q, order);
  store_sums(r, lane, bs, d_out);
}

// One 256-element block of x -> q (stored in `order`), its 16-element code sums and its scale. The
// quantize kernel and the dp4a kernel's in-block copy both call it, so their codes are the same bits.
__device__ __forceinline__ void quantize_block(const float* __restrict__ xb, int lane, int8_t* q, __half* bs,
                                               float* d_out, XOrder order = XOrder::kNatural) {
  float v[8];
  if ((reinterpret_cast<uintptr_t>(xb) & 15) == 0) {  // warp-uniform: rows are 16-byte aligned or not
    const float4 v0 = reinterpret_cast<const float4*>(xb)[2 * lane], v1 = reinterpret_cast<const float4*>(xb)[2 * lane + 1];
    v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = xb[8 * lane + e];
  }
  quantize_values(v, lane, q, bs, d_out, order);
}

// Block b = s * P + t of Q8K rows of pitch P: elements 256s.. of row t of x into out. (32-bit
// division: a 64-bit one is a ~100-instruction call, on the dp4a kernels' critical prologue.)
__device__ __forceinline__ void quantize_x_block(const float* x, int64_t x_stride, int P, int b, int lane,
                                                 const Q8K& out, XOrder order = XOrder::kNatural) {
  const int s = b / P, t = b - s * P;
  quantize_block(x + t * x_stride + int64_t{s} * 256, lane, out.q + int64_t{b} * 256, out.bs + int64_t{b} * 16,
                 out.d + b, order);
}

// x [n, K] f32 -> Q8K of pitch padded_tokens(n) (zeros past n), a warp per 256-element block. Bytes:
// read 4, write ~1.13 per element.
__global__ void quantize_q8k_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n, int64_t K, Q8K out,
                                    XOrder order) {
  pdl_wait();  // x belongs to the previous kernel
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int P = static_cast<int>(padded_tokens(n)), blocks = P * static_cast<int>(K / 256);
  const int warps = gridDim.x * blockDim.x / 32;
  for (int b = (blockIdx.x * blockDim.x + threadIdx.x) / 32; b < blocks; b += warps) {
    if (b % P < n) {
      quantize_x_block(x, x_stride, P, b, lane, out, order);
    } else {  // a padding row
      reinterpret_cast<uint2*>(out.q + b * 256)[lane] = make_uint2(0u, 0u);
      if (lane < 16) out.bs[b * 16 + lane] = __float2half(0.0f);
      if (lane == 0) out.d[b] = 0.0f;
    }
  }
}

struct Int8MvArgs {
  const uint8_t* w;
  const uint8_t* w2;  // fused SwiGLU: the up weights (w = gate)
  size_t row_bytes;
  int64_t n_out, K;
  Q8K x;              // quantized by quantize_q8k_kernel (tensor-core kernel)
  const float* xf;    // [n, K] f32, quantized in-block (dp4a kernel)
  int64_t xf_stride;
  int n;
  float* y;
  int64_t y_stride;
  // Int8ConvFold (kernels.h): outputs < conv_channels also feed the conv (conv_y null: none).
  const float* conv_w;
  float* conv_state;
  float* conv_y;
  int64_t conv_channels;
  float* conv_capture;    // several rows: each token's window, or null
  int64_t conv_y_stride;  // several rows
  Int8XFold xfold;  // one row quantized in-block: the op folded into the staging of x (kNone: none)
  float* residual = nullptr;  // one row, dp4a, no SwiGLU: residual[i] += y[i] as y[i] is stored
  int64_t tma_row0 = 0;       // TmaStepRing: the tensor map's row of w's first row (an expert's, in all experts')
};

// The blocks that serve one matvec: a launch's blocks (slot = blockIdx.x of gridDim.x), or a share of
// them when one launch runs several matvecs (multi_kernel).
struct BlockSlot {
  int idx, count;
};

// Outputs a tile: 16 rows, or with SwiGLU 8 gate and the same 8 up rows.
template <bool SW>
constexpr int kTileOutputs = SW ? kRows / 2 : kRows;

// The (tile, step) items a warp of a persistent block walks, in the order its ring (StepRing, TmaStepRing)
// issues them: warp ks takes steps ks, ks + 8, ... of tiles slot.idx, + slot.count, ... (kOut outputs a
// tile). WT (warp tiles, for K < 8 super-blocks): warp ks walks every step of its own tiles slot.idx * 8 +
// ks, + slot.count * 8, ... instead of sharing each tile with the block's warps. VW (with WT): a tile's
// steps in the block form's warp order (0, 8, .., then 1, 9, ..: s16_mma_warp_tiles).
template <int kOut, bool WT, bool VW>
struct StepWalk {
  int lane, ks, cnt;
  int64_t my_tiles, total, issued = 0, consumed = 0, i_tile, grid, first_tile;
  int i_m = 0;
  int i_s = 0, i_v = 0;  // VW: the issuing step's super-block and block-form warp

  __device__ explicit StepWalk(BlockSlot slot)
      : lane(threadIdx.x & 31), ks(threadIdx.x >> 5), i_tile(slot.idx), grid(slot.count) {}
  // The walk over a's tiles, set up after the ring's own pointers (the order the rings have always had).
  __device__ void start(const Int8MvArgs& a, BlockSlot slot) {
    const int64_t S = a.K / 256, tiles = (a.n_out + kOut - 1) / kOut;
    if constexpr (WT) i_tile = int64_t{slot.idx} * kWarps + ks, grid = int64_t{slot.count} * kWarps;
    first_tile = i_tile;
    my_tiles = i_tile < tiles ? (tiles - 1 - i_tile) / grid + 1 : 0;
    cnt = WT ? static_cast<int>(S) : ks < S ? static_cast<int>((S - 1 - ks) / kWarps + 1) : 0;
    total = my_tiles * cnt;
  }
  // The super-block of the item to issue (of tile i_tile).
  __device__ int issuing_step() const { return VW ? i_s : WT ? i_m : ks + kWarps * i_m; }
  // Past the item issued; new_tile() where it was its tile's last (i_tile is then the next tile).
  template <class F>
  __device__ void advance(F&& new_tile) {
    ++issued;
    if constexpr (VW) {
      i_s += kWarps;
      if (i_s >= cnt) i_s = ++i_v;
    }
    if (++i_m == cnt) {
      i_m = 0, i_tile += grid, new_tile();
      if constexpr (VW) i_s = i_v = 0;
    }
  }
  // The j-th tile this warp reads.
  __device__ int64_t tile(int64_t j) const { return first_tile + j * grid; }
};

// Row rr's block of super-block s in a ring's slot (16 rows of L::kSlotBytes), given the low 4 address bits of
// the row's start (Q6_K: a block sits in its slot row as in its 16-byte aligned cover).
template <class L>
__device__ __forceinline__ const uint8_t* slot_block(const uint8_t* slot, int rr, int row_mis, int64_t s) {
  const uint8_t* p = slot + rr * L::kSlotBytes;
  if constexpr (L::kAligned) return p;
  return p + ((row_mis + s * L::kBlockBytes) & 15);
}

// A warp's double-buffered ring of cp.async slots over its StepWalk's items: a slot holds the 16 rows'
// blocks of one step (16 x L::kSlotBytes) and one step is in flight while the other is read (deeper
// rings measured the same or slower on an H100: one token, 4096 x 12288, 1.97 TB/s at 2 slots, 1.88
// at 4, 1.72 at 6; on an H200 a ring of sm_90 bulk copies, one a row and step on per-stage mbarriers,
// made 9B decode 14% slower: ~200-byte copies are too small for the copy engine). A copy instruction of
// the warp moves whole blocks of kRowsPerCopy rows (lane l: row l / kPieces of the group, piece l %
// kPieces): each row's bytes stay one contiguous request (16 rows x 32 bytes per instruction measured
// 20% slower at one token). Addresses are the tile's first row plus the lane's piece (set once per
// tile) plus 32-bit offsets: the lane's row, the copy's group and the step (the 64-bit arithmetic per
// copy and step was ~130 of ~655 instructions per step of the 17-token kernel).
template <class L, bool SW, bool WT = false, bool VW = false>
struct StepRing : StepWalk<kTileOutputs<SW>, WT, VW> {
  using Walk = StepWalk<kTileOutputs<SW>, WT, VW>;
  using Walk::consumed, Walk::i_tile, Walk::issued, Walk::ks, Walk::lane, Walk::total;
  static constexpr int kStages = 2;
  static constexpr int kOut = kTileOutputs<SW>;
  static constexpr int kPieces = L::kPieces;
  static constexpr int kRowsPerCopy = 32 / kPieces;
  static constexpr int kCopies = (kRows + kRowsPerCopy - 1) / kRowsPerCopy;
  const Int8MvArgs& a;
  uint8_t* ring;
  float* red;  // after the rings: [warps][NMAX][16] partial sums
  int q, p;  // this lane's row in a copy group (q >= kRowsPerCopy: idle) and piece
  uint32_t lane_row, group_stride;  // q * row_bytes, kRowsPerCopy * row_bytes
  const uint8_t* gate;  // the issuing tile's first row (SW: of the gate weights), plus 16 p
  const uint8_t* up;    // SW: the up weights' first row of the tile, 8 rows back (slot rows 8..15), plus 16 p
  uint32_t copies;      // bit c: copy c holds a row of the issuing tile (rows past the matrix are not copied)

  __device__ StepRing(const Int8MvArgs& args, uint8_t* smem, BlockSlot slot) : Walk(slot), a(args) {
    ring = smem + ks * kStages * kRows * L::kSlotBytes;
    red = reinterpret_cast<float*>(smem + kWarps * kStages * kRows * L::kSlotBytes);
    this->start(a, slot);
    q = lane / kPieces, p = lane - q * kPieces;
    lane_row = static_cast<uint32_t>(q * a.row_bytes);
    group_stride = static_cast<uint32_t>(kRowsPerCopy * a.row_bytes);
    start_tile();
  }
  __device__ StepRing(const Int8MvArgs& args, uint8_t* smem, BlockSlot slot, const void* /*tma maps*/)
      : StepRing(args, smem, slot) {}
  __device__ void start_tile() {
    const int64_t first = i_tile * kOut, rb = static_cast<int64_t>(a.row_bytes);
    gate = a.w + first * rb + 16 * p;
    if constexpr (SW) up = a.w2 + first * rb - 8 * rb + 16 * p;
    const int64_t rows = min(int64_t{kOut}, a.n_out - first);
    copies = 0;
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      const int rr = c * kRowsPerCopy + q;  // the slot row
      if (q < kRowsPerCopy && rr < kRows && (SW ? (rr & 7) < rows : rr < rows)) copies |= 1u << c;
    }
  }
  // Row rr of a tile's slots: the weight row it holds (SW: 8 gate rows, then the same 8 up rows).
  __device__ const uint8_t* row_src(int64_t tile, int rr) const {
    if constexpr (SW) {
      const int64_t row = min(tile * kOut + (rr & 7), a.n_out - 1);
      return (rr < 8 ? a.w : a.w2) + row * static_cast<int64_t>(a.row_bytes);
    } else {
      return a.w + min(tile * kRows + rr, a.n_out - 1) * static_cast<int64_t>(a.row_bytes);
    }
  }
  __device__ void issue() {
    if (issued < total) {
      const uint32_t step = static_cast<uint32_t>(this->issuing_step()) * L::kBlockBytes;
      uint8_t* dst = ring + (issued & 1) * kRows * L::kSlotBytes + q * L::kSlotBytes + 16 * p;
#pragma unroll
      for (int c = 0; c < kCopies; ++c) {
        const bool on = (copies >> c) & 1u;
        const uint8_t* base = gate;
        if constexpr (SW) {  // a group may straddle the gate/up boundary
          if (c * kRowsPerCopy + q >= 8) base = up;
        }
        // The lane's piece of the row's block of this step, or of its 16-byte aligned cover: the piece's
        // address rounded down (base holds 16 p). A cover's last piece is needed where the block reaches it
        // (16 p < mis + kBlockBytes), which holds for every mis when kFullCover (Q6_K).
        const uint8_t* src = base + (lane_row + c * group_stride + step);
        if constexpr (L::kAligned) {
          cp_async16_if(on, dst + c * kRowsPerCopy * L::kSlotBytes, src);
        } else {
          constexpr bool kFullCover = 16 * (kPieces - 1) < L::kBlockBytes;  // every piece of every cover is needed
          const uintptr_t u = reinterpret_cast<uintptr_t>(src);
          const bool need = kFullCover || static_cast<int>(u & 15) + L::kBlockBytes > 16 * p;
          cp_async16_if(on && need, dst + c * kRowsPerCopy * L::kSlotBytes,
                        reinterpret_cast<const uint8_t*>(u & ~uintptr_t{15}));
        }
      }
      this->advance([&] { start_tile(); });
    }
    cp_async_commit();  // one group per call, empty or not, so wait_group counts items
  }
  __device__ void prime() { issue(); }
  // The next step's slot (its copies have landed), after queueing the copies of the one after.
  __device__ const uint8_t* next() {
    cp_async_wait<0>();  // this thread's copies of the step have landed
    __syncwarp();        // ... and every lane's; the slot refilled next was read before
    issue();
    return ring + (consumed++ & 1) * kRows * L::kSlotBytes;
  }
  // The low 4 address bits of row rr's blocks in `tile` (Q6_K: where a block sits in its cover).
  __device__ int row_misalignment(int64_t tile, int rr) const {
    return static_cast<int>(reinterpret_cast<uintptr_t>(row_src(tile, rr)) & 15);
  }
  // Row rr's block of super-block s in its slot, given its row_misalignment.
  __device__ const uint8_t* block(const uint8_t* slot, int rr, int row_mis, int64_t s) const {
    return slot_block<L>(slot, rr, row_mis, s);
  }
};

// The tensor maps of a TMA-fed launch (tensor_maps): the weights', and with SwiGLU the up weights'.
struct TmaMaps {
  CUtensorMap w, up;
};
// A TMA kernel's stage mbarriers sit in the first kTmaBarBytes of its shared memory; the body gets the
// rest (so every other offset is the cp.async kernels'), 128-byte aligned as the boxes' destinations need.
// kStages stages a warp (a deeper ring: tma_third_stage), 128-byte multiples.
template <int kStages>
constexpr size_t kTmaBarBytesFor = (kWarps * kStages * 8 + 127) / 128 * 128;
constexpr size_t kTmaBarBytes = kTmaBarBytesFor<2>;

// How a TMA map groups a weight's rows (TmaStepRing, weight_tensor_map): 0 rows of a 16-byte multiple, one a map
// row; 1 rows 8 bytes past one, two a map row (its stride then a 16-byte multiple, as a map needs); -1 no map.
__host__ __device__ constexpr int row_group_log2(size_t row_bytes) {
  return row_bytes % 16 == 0 ? 0 : row_bytes % 8 == 0 ? 1 : -1;
}

// StepRing fed by TMA (sm_90): a step's 16 rows arrive as one box, issued by lane 0 on the stage's
// mbarrier, where the cp.async ring takes ~6 copies a lane with their address and predicate arithmetic (53
// of a 16-token Q4_K warp-step's 467 instructions: PERFORMANCE.md "Session 48"). SW: 8 gate rows and the
// same 8 up rows, a box of each map. The mbarriers are the kTmaBarBytes below smem. Rows past the matrix
// arrive as zeros (TMA's out-of-bounds fill).
// - A 16-byte multiple block (Q4_K): a box {block, 1, rows} of a 3D map [rows][super-blocks][block bytes]
//   lands each block as the cp.async ring's slot holds it, so the bits are the same.
// - Q6_K (210 bytes): a box {slot bytes, rows} of a 2D map [rows][row bytes] (rows a 16-byte multiple)
//   started at the 16-byte aligned cover of the step's blocks lands each as the cp.async ring's slot holds
//   it, at the same offset in its cover (a box started elsewhere in the row was an illegal instruction on
//   the H200), so the bits are the same. Past the row: zeros. Rows of 8 bytes past a 16-byte multiple (K =
//   5120, 17408: the 27B's) pair up on the tensor-core kernels (tensor_maps): the map's rows are row pairs
//   [rows / 2][2 x row bytes], and a step is two boxes of 8 pairs, the even rows' covers then the odd rows'
//   (each started at its own aligned cover), so slot row slot_row(rr) holds row rr as the cp.async ring's
//   slot row rr would (row_group_log2).
// kCopiesToo: the body also issues cp.async copies (a several-row conv fold's ConvTile), waited for with
// each step as StepRing waits for them. WT, VW: StepRing's warp tiles and their order.
// kStagesT: the ring's depth (2; 3 for Q4_K's one-n-tile tensor-core kernel, tma_third_stage: it
// moves the partial sums, so not with a conv tile).
template <class L, bool SW, bool kCopiesToo = false, bool WT = false, bool VW = false, int kStagesT = 2>
struct TmaStepRing : StepWalk<kTileOutputs<SW>, WT, VW> {
  using Walk = StepWalk<kTileOutputs<SW>, WT, VW>;
  using Walk::consumed, Walk::i_tile, Walk::issued, Walk::ks, Walk::lane, Walk::total;
  static_assert(!L::kAligned || L::kSlotBytes == L::kBlockBytes);
  static constexpr int kStages = kStagesT;
  static_assert(kStages == 2 || !kCopiesToo);
  static constexpr int kOut = kTileOutputs<SW>;
  static constexpr uint32_t kStepBytes = kRows * L::kSlotBytes;
  static_assert(kStepBytes % 128 == 0 && (kStepBytes / 2) % 128 == 0);
  const Int8MvArgs& a;
  const TmaMaps* maps;  // the launch's __grid_constant__ maps
  uint8_t* ring;
  float* red;
  uint32_t bars;  // this warp's stage barriers (shared-space address)
  int issue_st = 0, use_st = 0;  // kStages != 2: the stages of the next issue and the next use
  uint32_t use_phase = 0;        // ... and the use's phase parity
  int pairs = 0;                 // Q6_K: 1 where the map's rows are row pairs (row_group_log2)

  __device__ TmaStepRing(const Int8MvArgs& args, uint8_t* smem, BlockSlot slot, const TmaMaps* tensor_maps)
      : Walk(slot), a(args), maps(tensor_maps) {
    ring = smem + ks * kStages * kStepBytes;
    red = reinterpret_cast<float*>(smem + kWarps * kStages * kStepBytes);
    bars = smem_addr(smem) - static_cast<uint32_t>(kTmaBarBytesFor<kStages>) + 8 * kStages * ks;
    if constexpr (!L::kAligned) pairs = row_group_log2(a.row_bytes) == 1;
    this->start(a, slot);
    if (lane == 0) {
#pragma unroll
      for (int st = 0; st < kStages; ++st) mbar_init(bars + 8 * st, 1);
      mbar_init_fence();
    }
    __syncwarp();
  }
  // Every box issued has landed and been read by then (a body consumes all `total` steps). The barriers'
  // location may hold the next ring's (s16_mma_wt_parts).
  __device__ ~TmaStepRing() {
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int st = 0; st < kStages; ++st) mbar_inval(bars + 8 * st);
    }
    __syncwarp();
  }
  // The boxes of rows row.. of step s: one, or with row pairs the even rows' then the odd rows' (kOut / 2
  // slot rows each).
  __device__ void load(uint32_t dst, const CUtensorMap* map, int s, int row, uint32_t bar) const {
    if constexpr (L::kAligned) {
      tma_load_3d(dst, map, 0, s, row, bar);
    } else if (!pairs) {
      tma_load_2d(dst, map, (s * L::kBlockBytes) & ~15, row, bar);
    } else {
      const int x = s * L::kBlockBytes, rb = static_cast<int>(a.row_bytes);
      tma_load_2d(dst, map, x & ~15, row >> 1, bar);
      tma_load_2d(dst + kOut / 2 * L::kSlotBytes, map, (rb + x) & ~15, row >> 1, bar);
    }
  }
  __device__ void issue() {
    if (issued < total) {
      if (lane == 0) {
        const int st = kStages == 2 ? static_cast<int>(issued & 1) : issue_st;
        const int row = static_cast<int>(a.tma_row0 + i_tile * kOut);
        const int s = this->issuing_step();
        const uint32_t bar = bars + 8 * st, dst = smem_addr(ring + st * kStepBytes);
        fence_proxy_async_smem();  // the warp's reads of this slot (before the caller's __syncwarp) come first
        mbar_expect_tx(bar, kStepBytes);
        load(dst, &maps->w, s, row, bar);
        if constexpr (SW) load(dst + kStepBytes / 2, &maps->up, s, row, bar);
      }
      if constexpr (kStages != 2) issue_st = issue_st + 1 == kStages ? 0 : issue_st + 1;
      this->advance([] {});
    }
  }
  // The first kStages - 1 steps in flight.
  __device__ void prime() {
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) issue();
  }
  // The next step's slot (its box has landed), after queueing the box of the one after.
  __device__ const uint8_t* next() {
    if constexpr (kCopiesToo) cp_async_wait<0>();
    if constexpr (kStages == 2) {
      const int st = static_cast<int>(consumed & 1);
      const uint32_t parity = static_cast<uint32_t>((consumed >> 1) & 1);
      while (!mbar_try_wait(bars + 8 * st, parity)) {
      }
      __syncwarp();  // every lane has read the slot refilled next
      issue();
      return ring + (consumed++ & 1) * kStepBytes;
    } else {
      const int st = use_st;
      while (!mbar_try_wait(bars + 8 * st, use_phase)) {
      }
      __syncwarp();  // every lane has read the slot refilled next (the one used before this)
      issue();
      ++consumed;
      if (++use_st == kStages) use_st = 0, use_phase ^= 1u;
      return ring + st * kStepBytes;
    }
  }
  // Rows start 16-byte aligned (weight_tensor_map), so a block's offset in its slot row is its offset in the row's
  // 16-byte pieces, as in StepRing; with row pairs an odd row starts 8 bytes past (a pair and a tile's first
  // row start aligned).
  __device__ int row_misalignment(int64_t, int rr) const {
    if constexpr (L::kAligned) return 0;
    return pairs ? 8 * (rr & 1) : 0;
  }
  // Where row rr of the tile sits in the slot: with row pairs the even rows of each half (SwiGLU: gate, up)
  // come first.
  __device__ int slot_row(int rr) const {
    if constexpr (L::kAligned) return rr;
    if (!pairs) return rr;
    constexpr int kHalf = kOut;  // a half of the slot (a box's rows) holds kOut / 2 rows of each parity
    const int h = rr & (kHalf - 1);
    return (rr - h) + (h & 1) * (kHalf / 2) + (h >> 1);
  }
  __device__ const uint8_t* block(const uint8_t* slot, int rr, int row_mis, int64_t s) const {
    return slot_block<L>(slot, slot_row(rr), row_mis, s);
  }
};

// The packed 6-bit scales (sc) and mins (mn) of sub-blocks 4h..4h+3 of a Q4_K block header, one per byte.
__device__ __forceinline__ uint32_t q4k_sc(const uint4& hdr, int h) {
  return h ? (hdr.w & 0x0f0f0f0fu) | ((hdr.y >> 2) & 0x30303030u) : hdr.y & 0x3f3f3f3fu;
}
__device__ __forceinline__ uint32_t q4k_mn(const uint4& hdr, int h) {
  return h ? ((hdr.w >> 4) & 0x0f0f0f0fu) | ((hdr.z >> 2) & 0x30303030u) : hdr.z & 0x3f3f3f3fu;
}
__device__ __forceinline__ int byte_of(uint32_t packed, int i) { return static_cast<int>((packed >> (8 * i)) & 0xffu); }

// What a super-block adds to one output: the one rounding sequence both kernels use (isum and msum
// are exact), so the dp4a and the tensor-core kernel give the same bits.
__device__ __forceinline__ float add_super_block(float acc, int isum, float msum, float2 dmin, float dx) {
  const float u = fmaf(dmin.x, __int2float_rn(isum), -__fmul_rn(dmin.y, msum));
  return fmaf(dx, u, acc);
}

__device__ __forceinline__ int dot8(const uint32_t (&w)[8], int4 x0, int4 x1) {
  int s = __dp4a(static_cast<int>(w[0]), x0.x, 0);
  s = __dp4a(static_cast<int>(w[1]), x0.y, s);
  s = __dp4a(static_cast<int>(w[2]), x0.z, s);
  s = __dp4a(static_cast<int>(w[3]), x0.w, s);
  s = __dp4a(static_cast<int>(w[4]), x1.x, s);
  s = __dp4a(static_cast<int>(w[5]), x1.y, s);
  s = __dp4a(static_cast<int>(w[6]), x1.z, s);
  return __dp4a(static_cast<int>(w[7]), x1.w, s);
}

// A conv-folded tile's conv inputs (Int8ConvFold): thread r < 16's channel's 3 state values and 4
// weights, loaded when the tile starts (read at the write, their latency would end every tile); and
// (kResid: a one-row, one-output-a-row kernel) its row's residual value where the launch adds to one.
struct ConvPre {
  float s[3];
  float4 w;
  float res;
};
template <bool kConv, bool kResid = false>
__device__ __forceinline__ ConvPre conv_before(const Int8MvArgs& a, int64_t tile) {
  ConvPre p{};
  if constexpr (kResid) {
    const int64_t row = tile * kRows + threadIdx.x;
    if (a.residual && threadIdx.x < kRows && row < a.n_out) p.res = a.residual[row];
  }
  if constexpr (kConv) {
    const int64_t row = tile * kRows + threadIdx.x, C = a.conv_channels;
    if (threadIdx.x < kRows && row < C) {
      p.s[0] = a.conv_state[row], p.s[1] = a.conv_state[C + row], p.s[2] = a.conv_state[2 * C + row];
      p.w = *reinterpret_cast<const float4*>(a.conv_w + 4 * row);
    }
  }
  return p;
}

// Shared-memory copy of the quantized activations for the dp4a kernel: q [n*K], bs [n*K/16] halves
// (both multiples of 16 bytes since K % 256 == 0), d [n*K/256] floats.
constexpr size_t kMaxStagedX = 48 * 1024;
constexpr int64_t kInBlockMaxK = 8192;

// Shared memory of a launch; staged: room for the dp4a kernel's copy of the activations (kMaxStagedX);
// red_buffers: buffers of partial sums (kMmaRedBuffers). A several-row conv fold's ConvTile comes after it.
template <class L>
__host__ __device__ constexpr size_t smem_bytes(int nmax, bool staged, int red_buffers = 1) {
  return static_cast<size_t>(kWarps) * StepRing<L, false>::kStages * kRows * L::kSlotBytes +
         static_cast<size_t>(kWarps) * nmax * kRows * sizeof(float) * red_buffers + (staged ? kMaxStagedX : 0);
}

// A several-row conv fold's shared memory (after smem_bytes): the tile's conv weights and state rows, copied
// when the tile starts (their latency then hides behind its steps), and its outputs of every token.
struct ConvTile {
  float w[kRows][4];
  float state[3][kRows];
  float x[kInt8MvMaxWidth][kRows];
};
template <class L, int NMAX, bool kStaged>
__device__ __forceinline__ ConvTile* conv_tile_smem(uint8_t* smem) {
  return reinterpret_cast<ConvTile*>(smem + smem_bytes<L>(NMAX, kStaged));
}
// Thread i < 28 copies 16 bytes: the 16 rows' weights (i < 16), or 4 rows of state row (i - 16) / 4 (rows past
// the conv's channels are not copied: C % 4 == 0). Before the tile's first step, whose wait covers them: they
// are a group of their own (a copy not yet committed is not waited for; racecheck found a tile of one step a
// warp reading them unlanded).
__device__ __forceinline__ void conv_prefetch(const Int8MvArgs& a, ConvTile* ct, int64_t tile) {
  const int i = threadIdx.x;
  const int64_t C = a.conv_channels, r0 = tile * kRows;
  if (r0 < C && i < 16) {
    cp_async16_if(r0 + i < C, ct->w[i], a.conv_w + 4 * (r0 + i));
  } else if (r0 < C && i < 28) {
    const int j = (i - 16) >> 2, q = (i - 16) & 3;
    cp_async16_if(r0 + 4 * q < C, &ct->state[j][4 * q], a.conv_state + j * C + r0 + 4 * q);
  }
  cp_async_commit();
}

// Output (token c, tile row rr): the warps' partials red[warp][token][row] summed in order.
template <int NMAX>
__device__ __forceinline__ float sum_partials(const float* red, int c, int rr) {
  float v = 0.0f;
#pragma unroll
  for (int k = 0; k < kWarps; ++k) v += red[(k * NMAX + c) * kRows + rr];
  return v;
}

// Several tokens' write_tile with Int8ConvFold's conv (no SwiGLU): thread (c, rr) = (i / 16, i % 16) sums
// output (token c, row rr) as write_tile does and stores it to y and ct; after a barrier, thread (c, rr) of a
// conv row runs conv_kernel's arithmetic for token c over inputs c-3..c (the state rows before token 0): its
// output, its capture window and, for the last token, the new state. The caller's barrier after the tile
// keeps ct until every thread read it. A conv tile costs one barrier more; the conv's launch is saved.
template <int NMAX>
__device__ void write_tile_conv(const Int8MvArgs& a, const float* red, int64_t tile, ConvTile* ct) {
  constexpr int kThreads = kWarps * 32;
  const int64_t C = a.conv_channels;
  const bool conv_tile = tile * kRows < C;  // (block-uniform)
  for (int i = threadIdx.x; i < a.n * kRows; i += kThreads) {
    const int c = i / kRows, rr = i - c * kRows;
    const int64_t row = tile * kRows + rr;
    if (row >= a.n_out) continue;
    const float v = sum_partials<NMAX>(red, c, rr);
    a.y[c * a.y_stride + row] = v;
    if (conv_tile) ct->x[c][rr] = v;
  }
  if (!conv_tile) return;
  __syncthreads();
  for (int i = threadIdx.x; i < a.n * kRows; i += kThreads) {
    const int c = i / kRows, rr = i - c * kRows;
    const int64_t row = tile * kRows + rr;
    if (row >= C) continue;
    float win[4];  // in(c - 3 + j)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int tau = c - 3 + j;
      win[j] = tau < 0 ? ct->state[tau + 3][rr] : ct->x[tau][rr];
    }
    float acc = 0.0f;  // causal_conv_silu_launch's arithmetic (conv_kernel, kernel 4)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc += ct->w[rr][j] * win[j];
    a.conv_y[c * a.conv_y_stride + row] = silu(acc);
    if (a.conv_capture) {
#pragma unroll
      for (int j = 0; j < 3; ++j) a.conv_capture[(c * 3 + j) * C + row] = win[j + 1];
    }
    if (c == a.n - 1) {
#pragma unroll
      for (int j = 0; j < 3; ++j) a.conv_state[j * C + row] = win[j + 1];
    }
  }
}

// Sum the warps' partials red[warp][token][row] in order and write the tile (SW: silu(gate) * up).
// kConv: the conv of Int8ConvFold on outputs < conv_channels too: one row from conv_before's pre, several
// through write_tile_conv (ct: the caller's barrier after the tile is needed).
template <int NMAX, bool SW, bool kConv = false>
__device__ void write_tile(const Int8MvArgs& a, const float* red, int64_t tile, const ConvPre& pre = ConvPre{},
                           ConvTile* ct = nullptr) {
  if constexpr (kConv && NMAX > 1) {
    static_assert(!SW, "the conv folds into plain matvecs");
    write_tile_conv<NMAX>(a, red, tile, ct);
  } else {
    constexpr int kOut = SW ? kRows / 2 : kRows;
    for (int i = threadIdx.x; i < a.n * kOut; i += kWarps * 32) {
      const int c = i / kOut, rr = i - c * kOut;
      const int64_t row = tile * kOut + rr;
      if (row >= a.n_out) continue;
      float v = sum_partials<NMAX>(red, c, rr);
      if constexpr (SW) {
        const float u = sum_partials<NMAX>(red, c, rr + 8);
        v = silu(v) * u;  // the formula of the swiglu op (elementwise.cu)
      }
      a.y[c * a.y_stride + row] = v;
      if constexpr (NMAX == 1 && !SW) {
        if (a.residual) a.residual[row] = pre.res + v;  // (thread i < 16: row i of the tile, as conv_before loaded)
      }
      if constexpr (kConv) {
        const int64_t C = a.conv_channels;
        if (row < C) {  // causal_conv_silu_launch's arithmetic (conv_kernel, kernel 4): one product sum, then SiLU
          const float win[4] = {pre.s[0], pre.s[1], pre.s[2], v}, wc[4] = {pre.w.x, pre.w.y, pre.w.z, pre.w.w};
          float acc = 0.0f;
#pragma unroll
          for (int j = 0; j < 4; ++j) acc += wc[j] * win[j];
          a.conv_y[row] = silu(acc);
          a.conv_state[row] = pre.s[1], a.conv_state[C + row] = pre.s[2], a.conv_state[2 * C + row] = v;
        }
      }
    }
  }
}

__host__ __device__ constexpr size_t staged_x_bytes(int64_t n, int64_t K) {
  return static_cast<size_t>(n * K + n * K / 8 + n * K / 64);
}

// Int8XFold: a warp's 256-blocks ks, ks + 8, .. of the one row (K <= kInt8XFoldMaxK: at most 3 each).
// Lane l's 8 elements of each: the gate's activation (silu for the gated norm, sigmoid for the gate) and
// the norm weights, loaded and computed before the previous kernel is done where the gate is older
// (gate_early), so that only x's load and the norm stay after the wait.
// How the dp4a kernels stage x (their kXFold parameter): the generic paths, Int8XFold's op (kGatedNorm,
// kSigmoidGate) or its kPlain rounds. Each is an instantiation of its own: the gate's activations held
// across the wait take the op fold's kernels from 71-84 to ~106 registers (the rounds' kernels: 74-84).
constexpr int kStageNone = 0, kStageFold = 1, kStagePlain = 2, kStageNorm = 3;
constexpr int kXFoldBlocks = static_cast<int>(kInt8XFoldMaxK / (256 * kWarps));
static_assert(kXFoldBlocks * 256 * kWarps == kInt8XFoldMaxK && kInt8XFoldGroup == 128);
struct XFoldPre {
  float s[kXFoldBlocks][8], w[kXFoldBlocks][8];
};
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 v0 = reinterpret_cast<const float4*>(p)[0], v1 = reinterpret_cast<const float4*>(p)[1];
  v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
}
// Block i of this warp's (i < kXFoldBlocks): the gate's activations and the norm weights of its lane.
__device__ __forceinline__ void xfold_gate(const Int8MvArgs& a, int i, XFoldPre& pre) {
  const Int8XFold& f = a.xfold;
  const int c = 256 * ((threadIdx.x >> 5) + kWarps * i) + 8 * (threadIdx.x & 31);  // (32-bit: K <= 6144)
  const int group = static_cast<int>(f.gate_group), g = c / group;
  float v[8];
  load8(f.gate + g * f.gate_stride + (c - g * group), v);
  if (f.kind == Int8XFold::kGatedNorm) {
    load8(f.norm_w + c % kInt8XFoldGroup, pre.w[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) pre.s[i][e] = silu(v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) pre.s[i][e] = sigmoid(v[e]);
  }
}
template <int kXFold>
__device__ __forceinline__ void xfold_before(const Int8MvArgs& a, XFoldPre& pre) {
  if constexpr (kXFold == kStageNorm) {  // the norm weights of the lane's elements (model constants)
    const int nb = static_cast<int>(a.K / 256), ks = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < kXFoldBlocks; ++i)
      if (ks + kWarps * i < nb) load8(a.xfold.norm_w + 256 * (ks + kWarps * i) + 8 * (threadIdx.x & 31), pre.w[i]);
  }
  if constexpr (kXFold == kStageFold) {
    if (!a.xfold.gate_early) return;
    const int nb = static_cast<int>(a.K / 256), ks = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < kXFoldBlocks; ++i)
      if (ks + kWarps * i < nb) xfold_gate(a, i, pre);
  }
}
// The folded op on the warp's blocks of x (a.xf, one row), stored to the op's output by one block each,
// and quantized into the staged x (pitch 1). kPlain (no op) takes rows of up to kInt8PlainMaxK in two
// rounds of kXFoldBlocks blocks a warp.
constexpr int kXFoldRounds = static_cast<int>(kInt8PlainMaxK / kInt8XFoldMaxK);
static_assert(kXFoldRounds * kInt8XFoldMaxK == kInt8PlainMaxK);
template <int kXFold>
__device__ __forceinline__ void stage_folded_x(const Int8MvArgs& a, const Q8K& x, XFoldPre& pre) {
  const Int8XFold& f = a.xfold;
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5, nb = static_cast<int>(a.K / 256);
#pragma unroll
  for (int r = 0; r < (kXFold == kStagePlain ? kXFoldRounds : 1); ++r) {
    const int first = ks + kWarps * kXFoldBlocks * r;  // the round's first block
    if (first >= nb) break;                             // warp-uniform
    constexpr bool op = kXFold == kStageFold;
    // Every block's loads first: one L2 round trip (the stores into shared memory between would otherwise
    // keep each block's loads behind the previous block's, for all the compiler knows).
    float xv[kXFoldBlocks][8];
#pragma unroll
    for (int i = 0; i < kXFoldBlocks; ++i) {
      if (first + kWarps * i >= nb) break;  // warp-uniform
      if (op && !f.gate_early) xfold_gate(a, i, pre);
      load8(a.xf + 256 * (first + kWarps * i) + 8 * lane, xv[i]);
    }
#pragma unroll
    for (int i = 0; i < kXFoldBlocks; ++i) {
      const int b = first + kWarps * i;
      if (b >= nb) break;  // warp-uniform
      const int c = 256 * b + 8 * lane;
      float(&v)[8] = xv[i];
      if (op && f.kind == Int8XFold::kGatedNorm) {
        // rms_norm_kernel's group of 128 (a warp, lane t: elements 4t..4t+3, summed over xor 16, 8, 4, 2, 1)
        // is a half warp here, lane l holding its lanes 2l' and 2l'+1 (l' = l % 16): xor 8, 4, 2, 1 on each
        // of the two, then their sum, is the same tree.
        float se = add_squares(0.0f, make_float4(v[0], v[1], v[2], v[3]));
        float so = add_squares(0.0f, make_float4(v[4], v[5], v[6], v[7]));
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) {
          se += __shfl_xor_sync(0xffffffffu, se, o);
          so += __shfl_xor_sync(0xffffffffu, so, o);
        }
        const float inv = 1.0f / sqrtf((se + so) / static_cast<float>(kInt8XFoldGroup) + f.eps);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          v[e] = v[e] * inv;
          v[e] *= pre.w[i][e];
          v[e] *= pre.s[i][e];
        }
      } else if (op) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = v[e] * pre.s[i][e];
      }
      if (op && b % static_cast<int>(gridDim.x) == static_cast<int>(blockIdx.x)) {
        reinterpret_cast<float4*>(f.y + c)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(f.y + c)[1] = make_float4(v[4], v[5], v[6], v[7]);
      }
      quantize_values(v, lane, x.q + b * 256, x.bs + b * 16, x.d + b, XOrder::kNatural);
    }
  }
}

// Int8XFold::kRmsNorm with rms_norm_kernel's arithmetic (f.norm_threads = its block: tpg threads a row, thread
// lt holding float4s lt, lt + tpg, ..; int8_norm_fold_row says which rows):
// - tpg 512 (rows of 4096 and 6144): float4 64w + 2l + h is lane l's half h of 256-block w here, and float4 + 512k
//   that of block w + 8k (the lane's block i = k). So lane l plays the kernel's threads 64w + 2l (se) and
//   64w + 2l + 1 (so), each summing its float4s in k order; the kernel's warp tree (xor 16, 8, 4, 2, then 1
//   over its lane bits) is xor 8, 4, 2, 1 across lanes on each, then se + so; its warp 2w + l / 16's sum
//   goes through red (free until the first tile is written).
// - tpg 256 (rows of a multiple of 1024 up to 6144 but 4096): this block's thread t is the kernel's thread t;
//   it loads the kernel's float4s too (one round trip with the lane's blocks) for the sum of squares.
// Then the block's inverse rms from the warp sums, and the lane's blocks normed and quantized. Every block
// does this (one L2 round trip for the row and a block barrier) instead of waiting on a norm launch;
// elements of block b are stored to y by block b mod the grid.
__device__ __forceinline__ void stage_normed_x(const Int8MvArgs& a, const Q8K& x, const XFoldPre& pre, float* red) {
  const Int8XFold& f = a.xfold;
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5, nb = static_cast<int>(a.K / 256);
  float xv[kXFoldBlocks][8];
#pragma unroll
  for (int i = 0; i < kXFoldBlocks; ++i)
    if (ks + kWarps * i < nb) load8(a.xf + 256 * (ks + kWarps * i) + 8 * lane, xv[i]);
  if (f.norm_threads == 256) {
    constexpr int kMaxVec4 = static_cast<int>(kInt8XFoldMaxK / 1024);
    const int vec4 = static_cast<int>(a.K / 1024);
    float4 nv[kMaxVec4];
#pragma unroll
    for (int k = 0; k < kMaxVec4; ++k)
      if (k < vec4) nv[k] = reinterpret_cast<const float4*>(a.xf)[k * 256 + threadIdx.x];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxVec4; ++k)
      if (k < vec4) ss = add_squares(ss, nv[k]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[ks] = ss;
  } else {
    float se = 0.0f, so = 0.0f;
#pragma unroll
    for (int i = 0; i < kXFoldBlocks; ++i) {
      if (ks + kWarps * i >= nb) break;
      se = add_squares(se, make_float4(xv[i][0], xv[i][1], xv[i][2], xv[i][3]));
      so = add_squares(so, make_float4(xv[i][4], xv[i][5], xv[i][6], xv[i][7]));
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
      se += __shfl_xor_sync(0xffffffffu, se, o);
      so += __shfl_xor_sync(0xffffffffu, so, o);
    }
    if ((lane & 15) == 0) red[2 * ks + (lane >> 4)] = se + so;
  }
  __syncthreads();
  const float inv = inv_rms_of_warp_sums(red, f.norm_threads, a.K, f.eps);
#pragma unroll
  for (int i = 0; i < kXFoldBlocks; ++i) {
    const int b = ks + kWarps * i, c = 256 * b + 8 * lane;
    if (b >= nb) break;
    float(&v)[8] = xv[i];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = v[e] * inv;
      v[e] *= pre.w[i][e];
    }
    if (b % static_cast<int>(gridDim.x) == static_cast<int>(blockIdx.x)) {
      reinterpret_cast<float4*>(f.y + c)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(f.y + c)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    quantize_values(v, lane, x.q + b * 256, x.bs + b * 16, x.d + b, XOrder::kNatural);
  }
}

// The dp4a kernels' shared-memory copy of the quantized activations (the Q8K layout, packed), after
// the [warps][NMAX][16] partial sums at red: quantized here from a.xf, or copied from what
// quantize_q8k_kernel wrote (a.x); either way the same bits (quantize_block). Call after the previous
// kernel is done (pdl_wait).
template <int NMAX, int kXFold = kStageNone>
__device__ Q8K stage_x(const Int8MvArgs& a, float* red, XFoldPre& pre) {
  static_assert(NMAX <= 2, "one or two rows: the source pitch is padded_tokens(n) = 8");
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int64_t K = a.K, n = a.n, nb = K / 256;
  Q8K x;  // pitch n
  x.q = reinterpret_cast<int8_t*>(red + kWarps * NMAX * kRows);
  x.bs = reinterpret_cast<__half*>(x.q + n * K);
  x.d = reinterpret_cast<float*>(x.bs + n * K / 16);
  if constexpr (kXFold == kStageNorm) {  // the row's norm, quantized (one row)
    static_assert(NMAX == 1);
    stage_normed_x(a, x, pre, red);
  } else if constexpr (kXFold != kStageNone) {  // the folded op or x in rounds, quantized (one row)
    static_assert(NMAX == 1);
    stage_folded_x<kXFold>(a, x, pre);
  } else if (a.xf) {  // every block quantizes x for itself
    for (int b = ks; b < n * nb; b += kWarps) quantize_x_block(a.xf, a.xf_stride, static_cast<int>(n), b, lane, x);
  } else {  // or copies the rows of what quantize_q8k_kernel or a norm made (pitch 8: n <= 2 here)
    auto src_block = [&](int b) { return n == 1 ? 8 * b : 8 * (b >> 1) + (b & 1); };
    const int blocks = static_cast<int>(n * nb), t = threadIdx.x;
    constexpr int kThreads = kWarps * 32;
    auto code = [&](int i) {
      return __ldg(reinterpret_cast<const uint4*>(a.x.q + src_block(i >> 4) * 256) + (i & 15));
    };
    auto sums = [&](int i) {
      return __ldg(reinterpret_cast<const uint4*>(a.x.bs + src_block(i >> 1) * 16) + (i & 1));
    };
    // A thread's first two pieces of codes (16 x 16 bytes a block), its sums (2 x 16 bytes) and scale
    // loaded before any is stored: one L2 round trip for rows of up to 8192 (blocks <= 128 always).
    uint4 c0{}, c1{}, s0{};
    float d0 = 0.0f;
    if (t < 16 * blocks) c0 = code(t);
    if (t + kThreads < 16 * blocks) c1 = code(t + kThreads);
    if (t < 2 * blocks) s0 = sums(t);
    if (t < blocks) d0 = __ldg(a.x.d + src_block(t));
    if (t < 16 * blocks) reinterpret_cast<uint4*>(x.q)[t] = c0;
    if (t + kThreads < 16 * blocks) reinterpret_cast<uint4*>(x.q)[t + kThreads] = c1;
    if (t < 2 * blocks) reinterpret_cast<uint4*>(x.bs)[t] = s0;
    if (t < blocks) x.d[t] = d0;
    for (int i = t + 2 * kThreads; i < 16 * blocks; i += kThreads) reinterpret_cast<uint4*>(x.q)[i] = code(i);
    for (int i = t + kThreads; i < 2 * blocks; i += kThreads) reinterpret_cast<uint4*>(x.bs)[i] = sums(i);
    for (int b = t + kThreads; b < blocks; b += kThreads) x.d[b] = __ldg(a.x.d + src_block(b));
  }
  __syncthreads();
  return x;
}

// A dp4a kernel's tile: lane (r, 0)'s outputs (row r, every token) to red, then the warps summed in
// order and written (both halves of a row hold the same sums).
template <int NMAX, bool SW, bool WT = false, bool kConv = false>
__device__ __forceinline__ void write_dp4a_tile(const Int8MvArgs& a, float* red, const float (&acc)[NMAX], int64_t tile,
                                                int r, int h, int ks, const ConvPre& pre, ConvTile* ct = nullptr) {
  if constexpr (WT) {  // the warp's own tile: its sums are the outputs
    static_assert(!SW, "warp tiles: no fused SwiGLU");
    const int64_t row = tile * kRows + r;
#pragma unroll
    for (int c = 0; c < NMAX; ++c)
      if (h == 0 && c < a.n && row < a.n_out) a.y[c * a.y_stride + row] = acc[c];
    return;
  }
  if (h == 0) {  // every token slot (red holds NMAX; write_tile reads c < n): no branch a store
#pragma unroll
    for (int c = 0; c < NMAX; ++c) red[(ks * NMAX + c) * kRows + r] = acc[c];
  }
  __syncthreads();
  write_tile<NMAX, SW, kConv>(a, red, tile, pre, ct);
  __syncthreads();  // red is rewritten by the next tile
}

// dp4a kernel, lane = row: lane (r, h) = (lane % 16, lane / 16) takes row r and sub-blocks 4h..4h+3
// of each step; the two halves' integer sums meet by a shuffle. NMAX: accumulators per lane (n <=
// NMAX). Cheapest for one token (no idle lanes). The quantized activations (<= kMaxStagedX bytes)
// live in shared memory: read from L1/L2 next to the dot products, their latency stalled the warps.
// Up to kInBlockMaxK inputs every block quantizes them itself (quantize_block, the bits of
// quantize_q8k_kernel): one launch per matvec instead of two. Above, each block's reading all of x as
// f32 from L2 cost more than the launch (12288 x 4096: 1.19 vs 1.89 TB/s), so quantize_q8k_kernel
// runs first and the blocks copy its output.
// Q5 (Q5_K): the same with the fifth bit of every code from qh.
// kConv: the tiles fold Int8ConvFold's conv (its own instantiation: the prefetched inputs take registers);
// kXFold: x staged through Int8XFold (one row: kStageFold, kStagePlain).
template <int NMAX, bool SW, bool Q5 = false, bool WT = false, bool kConv = false, int kXFold = kStageNone,
          bool kTma = false>
__device__ __forceinline__ void q4k_dp4a_body(const Int8MvArgs& a, uint8_t* smem, BlockSlot slot,
                                              const TmaMaps* maps = nullptr) {
  using L = std::conditional_t<Q5, Q5KLayout, Q4KLayout>;
  constexpr int kQs = Q5 ? 48 : 16;  // offset of qs in the block
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int r = lane & 15, h = lane >> 4;
  static_assert(!kTma || !Q5);
  std::conditional_t<kTma, TmaStepRing<L, SW, (kConv && NMAX > 1), WT>, StepRing<L, SW, WT>> ring(a, smem, slot, maps);
  ConvTile* const ct = kConv && NMAX > 1 ? conv_tile_smem<L, NMAX, true>(smem) : nullptr;
  float* const red = ring.red;
  const int64_t my_tiles = ring.my_tiles, n = a.n;
  ring.prime();
  XFoldPre xpre;
  xfold_before<kXFold>(a, xpre);
  pdl_wait();  // the activations belong to the previous kernel
  pdl_trigger();
  const Q8K x = stage_x<NMAX, kXFold>(a, red, xpre);

  for (int64_t j = 0; j < my_tiles; ++j) {
    const int64_t tile = ring.tile(j);
    const ConvPre pre = conv_before<kConv && NMAX == 1, NMAX == 1 && !SW && !WT>(a, tile);
    if constexpr (kConv && NMAX > 1) conv_prefetch(a, ct, tile);
    float acc[NMAX];
#pragma unroll
    for (int c = 0; c < NMAX; ++c) acc[c] = 0.0f;
    for (int m = 0; m < ring.cnt; ++m) {
      const uint8_t* blk = ring.next() + r * L::kBlockBytes;
      const int64_t s = WT ? m : ks + int64_t{kWarps} * m;  // super-block of the row
      const uint4 hdr = *reinterpret_cast<const uint4*>(blk);
      const uint32_t sc = q4k_sc(hdr, h), mn = q4k_mn(hdr, h);
      const float2 dmin = __half22float2(as_half2(hdr.x));
      // Sub-block 2g (g = 0..3) is the low nibbles of qs[32g .. 32g+32), 2g+1 the high ones, element l
      // in byte l: word k of the masked bytes holds elements 4k..4k+3, the order of the int8 x.
      uint32_t wq[4][8];
#pragma unroll
      for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int v = 0; v < 2; ++v) {
          const uint4 u = *reinterpret_cast<const uint4*>(blk + kQs + 64 * h + 32 * g + 16 * v);
          const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            wq[2 * g][4 * v + k] = words[k] & 0x0f0f0f0fu;
            wq[2 * g + 1][4 * v + k] = (words[k] >> 4) & 0x0f0f0f0fu;
          }
        }
      if constexpr (Q5) {  // qh word k holds the fifth bits of elements 4k..4k+3 of every sub-block
        const uint4 q0 = *reinterpret_cast<const uint4*>(blk + 16), q1 = *reinterpret_cast<const uint4*>(blk + 32);
        const uint32_t qh[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int k = 0; k < 8; ++k) wq[i][k] |= ((qh[k] >> (4 * h + i)) & 0x01010101u) << 4;
      }
#pragma unroll
      for (int c = 0; c < NMAX; ++c) {
        if (c >= n) break;  // warp-uniform
        const int64_t xb = s * n + c;  // the activations' block
        const int4* xp = reinterpret_cast<const int4*>(x.q + xb * 256 + 128 * h);
        int isum = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) isum += byte_of(sc, i) * dot8(wq[i], xp[2 * i], xp[2 * i + 1]);
        // The 16-element sums of sub-blocks 4h..4h+3: exact small integers, so msum is exact.
        const uint4 bsv = *reinterpret_cast<const uint4*>(x.bs + xb * 16 + 8 * h);
        const uint32_t bsw[4] = {bsv.x, bsv.y, bsv.z, bsv.w};
        float msum = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 b2 = __half22float2(as_half2(bsw[i]));
          msum = fmaf(static_cast<float>(byte_of(mn, i)), b2.x + b2.y, msum);
        }
        isum += __shfl_xor_sync(0xffffffffu, isum, 16);
        msum += __shfl_xor_sync(0xffffffffu, msum, 16);
        acc[c] = add_super_block(acc[c], isum, msum, dmin, x.d[xb]);
      }
    }
    write_dp4a_tile<NMAX, SW, WT, kConv>(a, red, acc, tile, r, h, ks, pre, ct);
  }
  cp_async_wait<0>();
}

__device__ __forceinline__ uint32_t dup_half(int v) { return as_u32(__half2half2(__int2half_rn(v))); }

// The end of a super-block in the tensor-core kernels, per n-tile: msum by one exact f16 MMA (A = ma,
// the type's small integers per 16-code group; B = the tokens' 16-code sums) and the type's addition of
// the super-block to lane (g, t)'s four outputs (`add(acc, isum, msum, row_half, dx)`).
// The activations are padded to whole n-tiles (pitch NT * 8), so no token needs a bounds check.
template <int NT, bool kMsum = true, class Add>
__device__ __forceinline__ void finish_super_block(const Int8MvArgs& a, int64_t s, int g, int t, const uint32_t (&ma)[4],
                                                   const int (&isum)[NT][4], float (&acc)[NT][4], Add add) {
  const __half* bs = a.x.bs + (s * (NT * 8) + g) * 16 + 2 * t;  // token g's sums 2t, 2t+1 (+ 8 tokens per n-tile)
  const float* dx = a.x.d + s * (NT * 8) + 2 * t;               // tokens 2t, 2t + 1 (+ 8 per n-tile)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float msum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kMsum) {
      const uint32_t bb0 = __ldg(reinterpret_cast<const uint32_t*>(bs + nt * 128));
      const uint32_t bb1 = __ldg(reinterpret_cast<const uint32_t*>(bs + nt * 128 + 8));
      mma_16816(msum, ma[0], ma[1], ma[2], ma[3], bb0, bb1);
    }
    const float2 dxp = __ldg(reinterpret_cast<const float2*>(dx + nt * 8));  // 2t even: 8-byte aligned
    const float dx0 = dxp.x, dx1 = dxp.y;
    acc[nt][0] = add(acc[nt][0], isum[nt][0], msum[0], 0, dx0);
    acc[nt][1] = add(acc[nt][1], isum[nt][1], msum[1], 0, dx1);
    acc[nt][2] = add(acc[nt][2], isum[nt][2], msum[2], 1, dx0);
    acc[nt][3] = add(acc[nt][3], isum[nt][3], msum[3], 1, dx1);
  }
}

// Buffers of partial sums a tensor-core kernel alternates between by tile: two for the fused SwiGLU at two
// n-tiles, so that one barrier a tile does (a warp writes a buffer only after every thread passed the barrier
// that follows its reads of it, two tiles back); one, and a second barrier, elsewhere. H100 (PERFORMANCE.md
// "Session 38"): one barrier a tile took the fused SwiGLU's 16-token kernel bench from 30.0 to 27.3 us (Q4_K
// 4096 x 12288; Q6_K 40.9 -> 38.2) and a 16-row verify step of the 9B from 3.332 to 3.301 ms; in every
// tensor-core kernel it ran 17-row steps 1.3% slower, so the others keep their code. launch() sizes each
// kernel's shared memory by it.
template <int NT, bool SW>
constexpr int kMmaRedBuffers = SW && NT == 2 ? 2 : 1;

// The partial sums' buffer of a tensor-core kernel's j-th tile.
template <int NT, bool SW>
__device__ __forceinline__ float* mma_red(float* red, int64_t j) {
  return kMmaRedBuffers<NT, SW> == 2 ? red + (j & 1) * (kWarps * NT * 8 * kRows) : red;
}

// A tensor-core kernel's tile: lane (g, t)'s outputs (rows g, g+8; tokens 2t, 2t+1 of each n-tile) to
// red (mma_red), then the warps summed in order and written.
template <int NT, bool SW, bool kConv = false>
__device__ __forceinline__ void write_mma_tile(const Int8MvArgs& a, float* red, const float (&acc)[NT][4], int64_t tile,
                                               int g, int t, int ks, ConvTile* ct = nullptr) {
  constexpr int NMAX = NT * 8;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = nt * 8 + 2 * t + (e & 1), rr = g + (e >= 2 ? 8 : 0);
      if (c < a.n) red[(ks * NMAX + c) * kRows + rr] = acc[nt][e];  // (every slot: verify-16 +2.7%, session 48)
    }
  __syncthreads();
  write_tile<NMAX, SW, kConv>(a, red, tile, ConvPre{}, ct);
  if constexpr (kMmaRedBuffers<NT, SW> == 1) __syncthreads();  // red is rewritten by the next tile
}

// Sub-blocks 4hh..4hh+3 of a q4k_mma_body step (rows g, g + 8's blocks b0, b1, their fifth bits qh (Q5) and
// scales sc) against the tokens' B fragments bx, added to lane (g, t)'s integer sums.
template <int NT, bool Q5, int kQs>
__device__ __forceinline__ void q4k_mma_half(int hh, const uint4 (&bx)[NT][2], const uint8_t* b0, const uint8_t* b1,
                                             uint2 qh0, uint2 qh1, const uint32_t (&sc0)[2], const uint32_t (&sc1)[2],
                                             int t, int (&isum)[NT][4]) {
#pragma unroll
  for (int gh = 0; gh < 2; ++gh) {  // qs group gg = 2hh + gh: sub-blocks 2gg (low nibbles) and 2gg + 1
    const int gg = 2 * hh + gh;
    const uint2 w0 = *reinterpret_cast<const uint2*>(b0 + kQs + 32 * gg + 8 * t);
    const uint2 w1 = *reinterpret_cast<const uint2*>(b1 + kQs + 32 * gg + 8 * t);
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int i = 2 * gg + hi;
      const int sh = 4 * hi;
      uint32_t a0 = (w0.x >> sh) & 0x0f0f0f0fu, a2 = (w0.y >> sh) & 0x0f0f0f0fu;
      uint32_t a1 = (w1.x >> sh) & 0x0f0f0f0fu, a3 = (w1.y >> sh) & 0x0f0f0f0fu;
      if constexpr (Q5) {
        a0 |= ((qh0.x >> i) & 0x01010101u) << 4, a2 |= ((qh0.y >> i) & 0x01010101u) << 4;
        a1 |= ((qh1.x >> i) & 0x01010101u) << 4, a3 |= ((qh1.y >> i) & 0x01010101u) << 4;
      }
      const int s0 = byte_of(sc0[i >> 2], i & 3), s1 = byte_of(sc1[i >> 2], i & 3);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        int d[4];
        const uint4& b = bx[nt][gh];
        mma_s8(d, a0, a1, a2, a3, hi ? b.z : b.x, hi ? b.w : b.y);
        isum[nt][0] += s0 * d[0], isum[nt][1] += s0 * d[1];
        isum[nt][2] += s1 * d[2], isum[nt][3] += s1 * d[3];
      }
    }
  }
}

// The end of a q4k_mma_body step: finish_super_block with the rows' d and dmin (block headers hdr0, hdr1).
template <int NT>
__device__ __forceinline__ void q4k_finish_super_block(const Int8MvArgs& a, int64_t s, int g, int t, uint4 hdr0,
                                                       uint4 hdr1, const uint32_t (&ma)[4], const int (&isum)[NT][4],
                                                       float (&acc)[NT][4]) {
  const float2 dm0 = __half22float2(as_half2(hdr0.x)), dm1 = __half22float2(as_half2(hdr1.x));
  finish_super_block<NT>(a, s, g, t, ma, isum, acc, [&](float ac, int is, float ms, int r1, float dx) {
    return add_super_block(ac, is, ms, r1 ? dm1 : dm0, dx);
  });
}

// Tensor-core kernel for several tokens: one int8 mma.m16n8k32 per sub-block and 8 tokens gives the
// exact dot_i of 16 rows; lane (g, t) = (lane / 4, lane % 4) holds rows g, g+8 and tokens 2t, 2t+1 of
// each n-tile and adds sc_i * dot_i to its integer sums. msum is one f16 mma.m16n8k16 per super-block
// and n-tile: A[row][2i] = A[row][2i+1] = m_i, B[k][tok] = the k-th 16-element sum of the token's
// block, so sum_k A B = sum_i m_i bsum_i, exactly. The k order inside a sub-block is permuted (lane
// t's fragment columns 4t..4t+3 and 16+4t..16+4t+3 hold elements 8t..8t+7, weights and activations
// alike): each lane loads 8 contiguous bytes of a row's codes and of a token's int8 x.
// kTma: the weights arrive by TMA (TmaStepRing on the tensor maps `maps`; Q4_K).
template <int NT, bool SW, bool Q5 = false, bool kConv = false, bool kTma = false, int kStages = 2>
__device__ __forceinline__ void q4k_mma_body(const Int8MvArgs& a, uint8_t* smem, BlockSlot slot,
                                             const TmaMaps* maps = nullptr) {
  using L = std::conditional_t<Q5, Q5KLayout, Q4KLayout>;
  constexpr int kQs = Q5 ? 48 : 16;  // offset of qs in the block
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  static_assert(!kTma || !Q5);
  std::conditional_t<kTma, TmaStepRing<L, SW, kConv, false, false, kStages>, StepRing<L, SW>> ring(a, smem, slot, maps);
  ConvTile* const ct = kConv ? conv_tile_smem<L, NT * 8, false>(smem) : nullptr;
  float* const red = ring.red;
  const int64_t my_tiles = ring.my_tiles;
  ring.prime();
  pdl_wait();
  pdl_trigger();

  for (int64_t j = 0; j < my_tiles; ++j) {
    const int64_t tile = slot.idx + j * slot.count;
    if constexpr (kConv) conv_prefetch(a, ct, tile);
    float acc[NT][4];  // [n-tile][(row g, tok 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)]
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    // The fused SwiGLU at two n-tiles keeps the step's earlier order (x after next()): with x first its
    // 16-token kernel bench was 7% slower. Each form stays as measured (nvcc's code for these kernels
    // follows the source's form: a shared loop with the order as a constant gave other kernels other code,
    // PERFORMANCE.md "Session 37"); both take the step's MMAs from q4k_mma_half and its end from
    // q4k_finish_super_block, which leave every kernel's code as it was.
    if constexpr (SW && NT == 2) {
      for (int m = 0; m < ring.cnt; ++m) {
        const uint8_t* slot = ring.next();
        const uint8_t* b0 = slot + g * L::kBlockBytes;
        const uint8_t* b1 = slot + (g + 8) * L::kBlockBytes;
        // Q5: fifth bits of elements 8t..8t+7 (qh bytes 8t..) of every sub-block, rows g and g+8.
        const uint2 qh0 = Q5 ? *reinterpret_cast<const uint2*>(b0 + 16 + 8 * t) : make_uint2(0u, 0u);
        const uint2 qh1 = Q5 ? *reinterpret_cast<const uint2*>(b1 + 16 + 8 * t) : make_uint2(0u, 0u);
        const int64_t s = ks + int64_t{kWarps} * m;
        const uint4 hdr0 = *reinterpret_cast<const uint4*>(b0), hdr1 = *reinterpret_cast<const uint4*>(b1);
        const uint32_t sc0[2] = {q4k_sc(hdr0, 0), q4k_sc(hdr0, 1)}, sc1[2] = {q4k_sc(hdr1, 0), q4k_sc(hdr1, 1)};
        // msum's A fragment: m_t (columns 2t, 2t+1) and m_{t+4} (2t+8, 2t+9) of rows g and g+8.
        const uint32_t ma[4] = {dup_half(byte_of(q4k_mn(hdr0, 0), t)), dup_half(byte_of(q4k_mn(hdr1, 0), t)),
                                dup_half(byte_of(q4k_mn(hdr0, 1), t)), dup_half(byte_of(q4k_mn(hdr1, 1), t))};
        int isum[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) isum[nt][0] = isum[nt][1] = isum[nt][2] = isum[nt][3] = 0;
        // Half a step's B fragments first (sub-blocks 4hh..4hh+3, two 16-byte loads per n-tile in the
        // kFragQ4 layout, at constant offsets from the step's block of token g): their L1/L2 latency then
        // hides behind the A decoding. Padding tokens of the last n-tile load nothing (their codes are
        // zeros).
        const uint4* xs = reinterpret_cast<const uint4*>(a.x.q + (s * (NT * 8) + g) * 256 + 16 * t);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          uint4 bx[NT][2];  // sub-blocks 4hh + 2j (.x, .y) and 4hh + 2j + 1 (.z, .w)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const bool real = nt < NT - 1 || nt * 8 + g < a.n;
            bx[nt][0] = real ? __ldg(xs + nt * 128 + 8 * hh) : make_uint4(0u, 0u, 0u, 0u);
            bx[nt][1] = real ? __ldg(xs + nt * 128 + 8 * hh + 4) : make_uint4(0u, 0u, 0u, 0u);
          }
          q4k_mma_half<NT, Q5, kQs>(hh, bx, b0, b1, qh0, qh1, sc0, sc1, t, isum);
        }
        q4k_finish_super_block<NT>(a, s, g, t, hdr0, hdr1, ma, isum, acc);
      }
    } else {
      for (int m = 0; m < ring.cnt; ++m) {
        const int64_t s = ks + int64_t{kWarps} * m;
        // Half a step's B fragments (sub-blocks 4hh..4hh+3, two 16-byte loads per n-tile in the kFragQ4
        // layout, at constant offsets from the step's block of token g). Padding tokens of the last n-tile
        // load nothing (their codes are zeros). The first half's loads go out before the step's wait and the
        // next step's copies (next()), so that they do not queue behind those copies (H100, 9B Q4_K_M: a
        // 17-row verify step 3.78 -> 3.57 ms, 16 rows 3.39 -> 3.38; at 16 tokens the fused SwiGLU's kernel
        // bench went 7% slower and Q6_K's 2-5% faster).
        const uint4* xs = reinterpret_cast<const uint4*>(a.x.q + (s * (NT * 8) + g) * 256 + 16 * t);
        auto load_x = [&](int hh, uint4 (&bx)[NT][2]) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const bool real = nt < NT - 1 || nt * 8 + g < a.n;
            bx[nt][0] = real ? __ldg(xs + nt * 128 + 8 * hh) : make_uint4(0u, 0u, 0u, 0u);
            bx[nt][1] = real ? __ldg(xs + nt * 128 + 8 * hh + 4) : make_uint4(0u, 0u, 0u, 0u);
          }
        };
        uint4 bx_first[NT][2];
        load_x(0, bx_first);
        const uint8_t* slot = ring.next();
        const uint8_t* b0 = slot + g * L::kBlockBytes;
        const uint8_t* b1 = slot + (g + 8) * L::kBlockBytes;
        // Q5: fifth bits of elements 8t..8t+7 (qh bytes 8t..) of every sub-block, rows g and g+8.
        const uint2 qh0 = Q5 ? *reinterpret_cast<const uint2*>(b0 + 16 + 8 * t) : make_uint2(0u, 0u);
        const uint2 qh1 = Q5 ? *reinterpret_cast<const uint2*>(b1 + 16 + 8 * t) : make_uint2(0u, 0u);
        const uint4 hdr0 = *reinterpret_cast<const uint4*>(b0), hdr1 = *reinterpret_cast<const uint4*>(b1);
        const uint32_t sc0[2] = {q4k_sc(hdr0, 0), q4k_sc(hdr0, 1)}, sc1[2] = {q4k_sc(hdr1, 0), q4k_sc(hdr1, 1)};
        // msum's A fragment: m_t (columns 2t, 2t+1) and m_{t+4} (2t+8, 2t+9) of rows g and g+8.
        const uint32_t ma[4] = {dup_half(byte_of(q4k_mn(hdr0, 0), t)), dup_half(byte_of(q4k_mn(hdr1, 0), t)),
                                dup_half(byte_of(q4k_mn(hdr0, 1), t)), dup_half(byte_of(q4k_mn(hdr1, 1), t))};
        int isum[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) isum[nt][0] = isum[nt][1] = isum[nt][2] = isum[nt][3] = 0;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          uint4 bx[NT][2];  // sub-blocks 4hh + 2j (.x, .y) and 4hh + 2j + 1 (.z, .w)
          if (hh == 0) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) bx[nt][0] = bx_first[nt][0], bx[nt][1] = bx_first[nt][1];
          } else {
            load_x(1, bx);  // its latency hides behind the A decoding
          }
          q4k_mma_half<NT, Q5, kQs>(hh, bx, b0, b1, qh0, qh1, sc0, sc1, t, isum);
        }
        q4k_finish_super_block<NT>(a, s, g, t, hdr0, hdr1, ma, isum, acc);
      }
    }
    write_mma_tile<NT, SW, kConv>(a, mma_red<NT, SW>(red, j), acc, tile, g, t, ks, ct);
  }
  cp_async_wait<0>();
}

// ---- Sub-blocks of 16 codes with int8 scales: Q6_K, Q3_K, IQ4_XS -------------------------------
// A super-block of 256 weights: 16 sub-blocks of 16 small integer codes q with int8 scales sc_j, one
// f16 d, w = d * sc_j * (q - kOffset). Against int8 x it adds
//   dx * d * (isum - kOffset * msum),  isum = sum_j sc_j * dot_j,  msum = sum_j sc_j * bsum_j (exact integers)
// with one float rounding sequence (`add_s16_super_block`), in both kernels. A policy C gives a
// type's codes: raw(blk, h, k) loads what the codes of elements 4k..4k+3 (k < 8) of each 32-element
// group of half h need, codes(raw, h, k, grp) makes those of group grp (one per byte, int8), and
// scales(blk, w) the int8 scales of sub-blocks 4w..4w+3.
//   Q6_K (210 B): codes 0..63 (low 4 bits in ql, high 2 in qh), kOffset 32.
//   Q3_K (110 B): codes 0..7 (2 bits in qs, the third in hmask), kOffset 4; 6-bit scales minus 32.
//   IQ4_XS (136 B): 4-bit indices into the IQ4_NL codebook (int8 values), kOffset 0 (no msum); its
//     32-element sub-blocks' 6-bit scales minus 32, each the scale of two 16-code sub-blocks here.

// A block in a ring slot (Q6_K and Q3_K blocks keep their address mod 16 there, so start at any even
// address): u32(off) is the 32-bit word at byte off, from the two aligned words around it and one funnel
// shift. odd (the address mod 4) is the same for every word of the block, so no word branches, and the
// loads stay shared-memory loads (the address is pointer arithmetic on the slot, never an integer).
template <class L>
struct SlotBlock {
  const uint8_t* p;
  int odd;  // 0 or 2 (always 0 for blocks of a multiple of 4 bytes)
  __device__ explicit SlotBlock(const uint8_t* blk)
      : p(blk), odd(L::kBlockBytes % 4 == 0 ? 0 : static_cast<int>(reinterpret_cast<uintptr_t>(blk) & 2)) {}
  __device__ uint32_t u32(int off) const {
    if constexpr (L::kBlockBytes % 4 == 0) return *reinterpret_cast<const uint32_t*>(p + off);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(p + off - odd);
    return __funnelshift_r(w[0], w[1], 8 * odd);
  }
};
__device__ __forceinline__ int sbyte_of(uint32_t packed, int i) {
  return static_cast<int>(static_cast<int8_t>((packed >> (8 * i)) & 0xffu));
}

// The dp4a kernel reads a lane's half of a block (C::load_half) as whole 16-byte pieces of its slot row
// and realigns the words in registers: 4-byte loads of 16 rows at a 16-byte multiple apart hit only 8
// banks, 4 lanes to a bank (4 wavefronts a load; Q6_K: ~130 a warp-step, beside ~96 for the cp.async
// copies that fill the slot, one a 32-byte sector), while 16-byte loads of 8 such rows are one wavefront
// (9B decode 2.006 -> 1.935 ms on an H200, PERFORMANCE.md "Session 47"). (The tensor-core kernel's lanes
// read 4 rows' consecutive words, which hit distinct banks: it keeps SlotBlock.)
template <int N>
__device__ __forceinline__ void load_pieces(const uint8_t* row, int first, uint32_t (&w)[4 * N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint4 v = lds128(row + 16 * (first + i));
    w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
  }
}
// f(std::integral_constant<int, m / 4>): realigned words are register indices, so the word shift is a
// constant, and a switch picks it (warp-uniform where rows are 16-byte multiples, as on every 9B
// matrix: a warp's blocks then sit at one m over all its steps).
template <class F>
__device__ __forceinline__ void with_word_shift(int m, F&& f) {
  switch (m >> 2) {
    case 0: f(std::integral_constant<int, 0>{}); break;
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 3>{}); break;
  }
}
// Word i of the bytes that start sh / 8 bytes into word Q of w.
template <int Q, int N>
__device__ __forceinline__ uint32_t realigned(const uint32_t (&w)[N], int i, int sh) {
  return __funnelshift_r(w[Q + i], w[Q + i + 1], sh);
}
__device__ __forceinline__ float f16_bits(uint32_t u) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(u & 0xffffu)));
}

template <class C>
__device__ __forceinline__ float add_s16_super_block(float acc, int isum, float msum, float d, float dx) {
  const int total = C::kOffset ? isum - C::kOffset * __float2int_rn(msum) : isum;
  return fmaf(__fmul_rn(d, dx), __int2float_rn(total), acc);
}

struct Q6KCodes {
  using L = Q6KLayout;  // ql[128], qh[64], scales[16], d
  static constexpr int kOffset = 32, kD = 208;
  struct Raw {
    uint32_t A, B, H;  // ql words of groups 0/2 and 1/3, qh word (2 bits per group)
  };
  __device__ static Raw raw(const SlotBlock<L>& b, int h, int k) {
    return {b.u32(64 * h + 4 * k), b.u32(64 * h + 32 + 4 * k), b.u32(128 + 32 * h + 4 * k)};
  }
  __device__ static uint32_t codes(const Raw& r, int, int, int grp) {
    switch (grp) {
      case 0: return (r.A & 0x0f0f0f0fu) | ((r.H << 4) & 0x30303030u);
      case 1: return (r.B & 0x0f0f0f0fu) | ((r.H << 2) & 0x30303030u);
      case 2: return ((r.A >> 4) & 0x0f0f0f0fu) | (r.H & 0x30303030u);
      default: return ((r.B >> 4) & 0x0f0f0f0fu) | ((r.H >> 2) & 0x30303030u);
    }
  }
  __device__ static uint32_t scales(const SlotBlock<L>& b, int w) { return b.u32(192 + 4 * w); }

  // The dp4a kernel's lane half h of a block at byte m (even, < 16) of its 16-byte aligned slot row: raw
  // for k < 8, the scales of sub-blocks 8h..8h+7 and d, from ten 16-byte loads.
  __device__ static void load_half(const uint8_t* row, int m, int h, Raw (&raw)[8], uint32_t (&sc)[2], float& d) {
    uint32_t ql[20], qh[12], tail[8];  // pieces 4h.. (ql bytes 64h..), 8 + 2h.. (qh bytes 128 + 32h..), 12..13
    load_pieces<5>(row, 4 * h, ql), load_pieces<3>(row, 8 + 2 * h, qh), load_pieces<2>(row, 12, tail);
    const int sh = 8 * (m & 3);
    with_word_shift(m, [&](auto q) {
      constexpr int Q = decltype(q)::value;
#pragma unroll
      for (int k = 0; k < 8; ++k) raw[k] = {realigned<Q>(ql, k, sh), realigned<Q>(ql, 8 + k, sh), realigned<Q>(qh, k, sh)};
      uint32_t s[4];  // bytes 192..207
#pragma unroll
      for (int w = 0; w < 4; ++w) s[w] = realigned<Q>(tail, w, sh);
      sc[0] = h ? s[2] : s[0], sc[1] = h ? s[3] : s[1];
      d = f16_bits(tail[4 + Q] >> sh);  // bytes 208, 209
    });
  }
};

struct Q3KCodes {
  using L = BlockLayout<110>;  // hmask[32], qs[64], scales[12], d
  static constexpr int kOffset = 4, kD = 108;
  struct Raw {
    uint32_t q, hm;  // 2-bit codes of the half (group grp: bits 2grp), third bits (bit 4h + grp)
  };
  __device__ static Raw raw(const SlotBlock<L>& b, int h, int k) { return {b.u32(32 + 32 * h + 4 * k), b.u32(4 * k)}; }
  __device__ static uint32_t codes(const Raw& r, int h, int, int grp) {
    return ((r.q >> (2 * grp)) & 0x03030303u) | (((r.hm >> (4 * h + grp)) & 0x01010101u) << 2);
  }
  // Scale j: low 4 bits in byte j % 8 of scales (high nibble for j >= 8), high 2 bits at bit 2 (j / 4)
  // of byte 8 + j % 4.
  __device__ static uint32_t scales(const SlotBlock<L>& b, int w) {
    return scale_word(b.u32(96 + 4 * (w & 1)), b.u32(104), w);
  }
  __device__ static uint32_t scale_word(uint32_t lo, uint32_t hi, int w) {  // lo: bytes 96 + 4 (w % 2).., hi: 104..
    return __vsub4(((lo >> (4 * (w >> 1))) & 0x0f0f0f0fu) | (((hi >> (2 * w)) & 0x03030303u) << 4), 0x20202020u);
  }
  // As Q6KCodes::load_half, from eight 16-byte loads.
  __device__ static void load_half(const uint8_t* row, int m, int h, Raw (&raw)[8], uint32_t (&sc)[2], float& d) {
    uint32_t hm[12], qs[12], tail[8];  // pieces 0..2 (hmask), 2 + 2h.. (qs bytes 32 + 32h..), 6..7 (scales, d)
    load_pieces<3>(row, 0, hm), load_pieces<3>(row, 2 + 2 * h, qs), load_pieces<2>(row, 6, tail);
    const int sh = 8 * (m & 3);
    with_word_shift(m, [&](auto q) {
      constexpr int Q = decltype(q)::value;
#pragma unroll
      for (int k = 0; k < 8; ++k) raw[k] = {realigned<Q>(qs, k, sh), realigned<Q>(hm, k, sh)};
      const uint32_t hi = realigned<Q>(tail, 2, sh);
      sc[0] = scale_word(realigned<Q>(tail, 0, sh), hi, 2 * h);
      sc[1] = scale_word(realigned<Q>(tail, 1, sh), hi, 2 * h + 1);
      d = f16_bits(tail[3 + Q] >> sh);  // bytes 108, 109
    });
  }
};

// Four IQ4_NL codebook values (int8) for the 4-bit indices in the low nibbles of nib's bytes: two byte
// permutes over the codebook's halves, then a per-byte select on the index's top bit.
__device__ __forceinline__ uint32_t iq4nl_values(uint32_t nib) {
  constexpr uint32_t kLo0 = 0xBFAD9881u, kLo1 = 0xF6EADDCFu;  // -127, -104, -83, -65 | -49, -35, -22, -10
  constexpr uint32_t kHi0 = 0x26190D01u, kHi1 = 0x71594535u;  // 1, 13, 25, 38 | 53, 69, 89, 113
  const uint32_t i7 = nib & 0x07070707u, u = i7 | (i7 >> 4);
  const uint32_t sel = (u & 0xffu) | ((u >> 8) & 0xff00u);  // byte b's index in nibble b
  const uint32_t lo = __byte_perm(kLo0, kLo1, sel), hi = __byte_perm(kHi0, kHi1, sel);
  const uint32_t top = ((nib >> 3) & 0x01010101u) * 0xffu;
  return (hi & top) | (lo & ~top);
}

struct Iq4XsCodes {
  using L = BlockLayout<136>;  // d, scales_h (u16), scales_l[4], qs[128]
  static constexpr int kOffset = 0, kD = 0;
  // Group grp of half h is sub-block 4h + grp: qs bytes 16 (4h + grp) + l hold elements l (low nibble)
  // and 16 + l (high); elements 4k.. are word k % 4's nibbles k / 4.
  struct Raw {
    uint32_t w[4];
  };
  __device__ static Raw raw(const SlotBlock<L>& b, int h, int k) {
    const int q = 8 + 64 * h + 4 * (k & 3);
    return {{b.u32(q), b.u32(q + 16), b.u32(q + 32), b.u32(q + 48)}};
  }
  __device__ static uint32_t codes(const Raw& r, int, int k, int grp) {
    return iq4nl_values((r.w[grp] >> (4 * (k >> 2))) & 0x0f0f0f0fu);
  }
  // Sub-blocks 2w and 2w + 1 (32 elements each): low 4 bits in the nibbles of scales_l[w], high 2 at
  // bits 4w and 4w + 2 of scales_h; each twice (two 16-code sub-blocks).
  __device__ static uint32_t scales(const SlotBlock<L>& b, int w) {
    const uint32_t sh = b.u32(0) >> (16 + 4 * w), sl = (b.u32(4) >> (8 * w)) & 0xffu;
    const uint32_t even = (sl & 15u) | ((sh & 3u) << 4), odd = (sl >> 4) | (((sh >> 2) & 3u) << 4);
    return __vsub4(even * 0x0101u | odd * 0x01010000u, 0x20202020u);
  }
  // As Q6KCodes::load_half, but with SlotBlock's 4-byte loads: this kernel is held by its codebook
  // lookups, and 16-byte pieces realigned in registers measured 3-6% slower (H200, one token, 4096 x
  // 4096..12288; 111 registers against 56).
  __device__ static void load_half(const uint8_t* row, int m, int h, Raw (&raw)[8], uint32_t (&sc)[2], float& d) {
    const SlotBlock<L> b(row + m);
#pragma unroll
    for (int k = 0; k < 8; ++k) raw[k] = Iq4XsCodes::raw(b, h, k);
    sc[0] = scales(b, 2 * h), sc[1] = scales(b, 2 * h + 1);
    d = __half2float(*reinterpret_cast<const __half*>(b.p + kD));
  }
};

// dp4a kernel (one or two tokens), lane (r, h): row r, half h (elements 128h..128h+127, sub-blocks
// 8h..8h+7) of each step; x staged in shared memory as for Q4_K.
// kTma: the weights by TMA boxes (TmaStepRing on the tensor maps `maps`; Q6_K).
template <class C, int NMAX, bool SW, bool WT = false, bool kConv = false, int kXFold = kStageNone, bool kTma = false>
__device__ __forceinline__ void s16_dp4a_body(const Int8MvArgs& a, uint8_t* smem, BlockSlot slot,
                                              const TmaMaps* maps = nullptr) {
  using L = typename C::L;
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int r = lane & 15, h = lane >> 4;
  std::conditional_t<kTma, TmaStepRing<L, SW, (kConv && NMAX > 1), WT>, StepRing<L, SW, WT>> ring(a, smem, slot, maps);
  ConvTile* const ct = kConv && NMAX > 1 ? conv_tile_smem<L, NMAX, true>(smem) : nullptr;
  float* const red = ring.red;
  const int64_t my_tiles = ring.my_tiles, n = a.n;
  ring.prime();
  XFoldPre xpre;
  xfold_before<kXFold>(a, xpre);
  pdl_wait();
  pdl_trigger();
  const Q8K x = stage_x<NMAX, kXFold>(a, red, xpre);

  for (int64_t j = 0; j < my_tiles; ++j) {
    const int64_t tile = ring.tile(j);
    const ConvPre pre = conv_before<kConv && NMAX == 1, NMAX == 1 && !SW && !WT>(a, tile);
    if constexpr (kConv && NMAX > 1) conv_prefetch(a, ct, tile);
    float acc[NMAX];
#pragma unroll
    for (int c = 0; c < NMAX; ++c) acc[c] = 0.0f;
    const int mis = ring.row_misalignment(tile, r);
    for (int m = 0; m < ring.cnt; ++m) {
      const uint8_t* slot = ring.next();
      const int64_t s = WT ? m : ks + int64_t{kWarps} * m;
      const uint8_t* const blk = ring.block(slot, r, mis, s);
      const int off = static_cast<int>(reinterpret_cast<uintptr_t>(blk) & 15);
      typename C::Raw raw[8];
      uint32_t sc[2];  // sub-blocks 8h..8h+7
      float d;
      C::load_half(blk - off, off, h, raw, sc, d);
      uint32_t codes[4][8];  // [group][k]: elements 32 group + 4k .. + 3 of the half
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int grp = 0; grp < 4; ++grp) codes[grp][k] = C::codes(raw[k], h, k, grp);
#pragma unroll
      for (int c = 0; c < NMAX; ++c) {
        if (c >= n) break;  // warp-uniform
        const int64_t xb = s * n + c;  // the activations' block
        const int4* xp = reinterpret_cast<const int4*>(x.q + xb * 256 + 128 * h);
        int isum = 0;
#pragma unroll
        for (int grp = 0; grp < 4; ++grp)
#pragma unroll
          for (int half16 = 0; half16 < 2; ++half16) {  // sub-block 2 grp + half16 of the half
            const int4 x = xp[2 * grp + half16];
            int dot = __dp4a(static_cast<int>(codes[grp][4 * half16]), x.x, 0);
            dot = __dp4a(static_cast<int>(codes[grp][4 * half16 + 1]), x.y, dot);
            dot = __dp4a(static_cast<int>(codes[grp][4 * half16 + 2]), x.z, dot);
            dot = __dp4a(static_cast<int>(codes[grp][4 * half16 + 3]), x.w, dot);
            const int jl = 2 * grp + half16;
            isum += sbyte_of(sc[jl >> 2], jl & 3) * dot;
          }
        float msum = 0.0f;
        if constexpr (C::kOffset != 0) {
          const uint4 bsv = *reinterpret_cast<const uint4*>(x.bs + xb * 16 + 8 * h);
          const uint32_t bsw[4] = {bsv.x, bsv.y, bsv.z, bsv.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 b2 = __half22float2(as_half2(bsw[i]));
            msum = fmaf(static_cast<float>(sbyte_of(sc[i >> 1], 2 * (i & 1))), b2.x, msum);
            msum = fmaf(static_cast<float>(sbyte_of(sc[i >> 1], 2 * (i & 1) + 1)), b2.y, msum);
          }
          msum += __shfl_xor_sync(0xffffffffu, msum, 16);
        }
        isum += __shfl_xor_sync(0xffffffffu, isum, 16);
        acc[c] = add_s16_super_block<C>(acc[c], isum, msum, d, x.d[xb]);
      }
    }
    write_dp4a_tile<NMAX, SW, WT, kConv>(a, red, acc, tile, r, h, ks, pre, ct);
  }
  cp_async_wait<0>();
}

__device__ __forceinline__ void mma_s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// One step of a tensor-core tile for several tokens (super-block s of rows g, g + 8, whose blocks sit mis0,
// mis1 bytes into their 16-byte covers): its integer sums, added to acc by finish_super_block.
template <class C, int NT, class Ring>
__device__ __forceinline__ void s16_mma_step(const Int8MvArgs& a, Ring& ring, int64_t s, int g, int t, int mis0,
                                             int mis1, float (&acc)[NT][4]) {
  using L = typename C::L;
  // x of sub-blocks 8h + jl for token g of each n-tile: two 16-byte loads in the kFragQ6 layout
  // (padding tokens of the last n-tile load nothing: their codes are zeros). The first half's go out
  // before the step's wait and the next step's copies (next()), so that they do not queue behind them
  // (as in q4k_mma_body).
  auto load_x = [&](int h, uint32_t (&bx)[NT][8]) {
    const uint4* xs = reinterpret_cast<const uint4*>(a.x.q + (s * (NT * 8) + g) * 256 + 128 * h + 16 * t);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const bool real = nt < NT - 1 || nt * 8 + g < a.n;
      const uint4 v0 = real ? __ldg(xs + nt * 128) : make_uint4(0u, 0u, 0u, 0u);
      const uint4 v1 = real ? __ldg(xs + nt * 128 + 4) : make_uint4(0u, 0u, 0u, 0u);
      bx[nt][0] = v0.x, bx[nt][1] = v0.y, bx[nt][2] = v0.z, bx[nt][3] = v0.w;
      bx[nt][4] = v1.x, bx[nt][5] = v1.y, bx[nt][6] = v1.z, bx[nt][7] = v1.w;
    }
  };
  uint32_t bx_first[NT][8];
  load_x(0, bx_first);
  const uint8_t* slot = ring.next();
  const SlotBlock<L> p0(ring.block(slot, g, mis0, s)), p1(ring.block(slot, g + 8, mis1, s));
  uint32_t sc0[4], sc1[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) sc0[i] = C::scales(p0, i), sc1[i] = C::scales(p1, i);
  int isum[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) isum[nt][0] = isum[nt][1] = isum[nt][2] = isum[nt][3] = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t bx[NT][8];
    if (h == 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 8; ++e) bx[nt][e] = bx_first[nt][e];
    } else {
      load_x(1, bx);
    }
#pragma unroll
    for (int L16 = 0; L16 < 2; ++L16) {  // elements 16 L16 + 4t.. of each 32-element group
      const int k = 4 * L16 + t;
      const typename C::Raw r0 = C::raw(p0, h, k), r1 = C::raw(p1, h, k);
#pragma unroll
      for (int grp = 0; grp < 4; ++grp) {
        const int jl = 2 * grp + L16, jg = 8 * h + jl;  // sub-block of the half, of the block
        const uint32_t a0 = C::codes(r0, h, k, grp), a1 = C::codes(r1, h, k, grp);
        const int s0 = sbyte_of(sc0[jg >> 2], jg & 3), s1 = sbyte_of(sc1[jg >> 2], jg & 3);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          int d[4];
          mma_s8_k16(d, a0, a1, bx[nt][jl]);
          isum[nt][0] += s0 * d[0], isum[nt][1] += s0 * d[1];
          isum[nt][2] += s1 * d[2], isum[nt][3] += s1 * d[3];
        }
      }
    }
  }
  // msum's A fragment: sc_{2t}, sc_{2t+1} (columns 2t, 2t+1) and sc_{2t+8}, sc_{2t+9} of rows g, g+8.
  // (Selects, not an indexed array, keep the words in registers.)
  auto sc_pair = [&](const uint32_t (&sc)[4], int base) {  // sc_{j0}, sc_{j0+1}, j0 = 4 base + 2t
    const uint32_t w = (t >> 1) ? sc[base + 1] : sc[base];
    const int sh = 16 * (t & 1);
    return as_u32(__halves2half2(__int2half_rn(static_cast<int8_t>((w >> sh) & 0xffu)),
                                 __int2half_rn(static_cast<int8_t>((w >> (sh + 8)) & 0xffu))));
  };
  const uint32_t ma[4] = {sc_pair(sc0, 0), sc_pair(sc1, 0), sc_pair(sc0, 2), sc_pair(sc1, 2)};
  const float d0 = __half2float(*reinterpret_cast<const __half*>(p0.p + C::kD));
  const float d1 = __half2float(*reinterpret_cast<const __half*>(p1.p + C::kD));
  finish_super_block<NT, C::kOffset != 0>(a, s, g, t, ma, isum, acc, [&](float ac, int is, float ms, int r1, float dx) {
    return add_s16_super_block<C>(ac, is, ms, r1 ? d1 : d0, dx);
  });
}

// Tensor-core kernel for several tokens: one int8 mma.m16n8k16 per 16-code sub-block and 8 tokens
// (lane t's fragment columns 4t..4t+3 = the sub-block's elements 4t..4t+3); msum is one f16
// mma.m16n8k16 per super-block and n-tile (A[row][j] = sc_j, B[j][tok] = bsum_j: exact).
// kTma: the weights by TMA boxes (TmaStepRing on the tensor maps `maps`; Q6_K).
template <class C, int NT, bool SW, bool kConv = false, bool kTma = false>
__device__ __forceinline__ void s16_mma_body(const Int8MvArgs& a, uint8_t* smem, BlockSlot slot,
                                             const TmaMaps* maps = nullptr) {
  using L = typename C::L;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3, ks = threadIdx.x >> 5;
  std::conditional_t<kTma, TmaStepRing<L, SW, kConv>, StepRing<L, SW>> ring(a, smem, slot, maps);
  ConvTile* const ct = kConv ? conv_tile_smem<L, NT * 8, false>(smem) : nullptr;
  float* const red = ring.red;
  const int64_t my_tiles = ring.my_tiles;
  ring.prime();
  pdl_wait();
  pdl_trigger();

  for (int64_t j = 0; j < my_tiles; ++j) {
    const int64_t tile = slot.idx + j * slot.count;
    if constexpr (kConv) conv_prefetch(a, ct, tile);
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    const int mis0 = ring.row_misalignment(tile, g), mis1 = ring.row_misalignment(tile, g + 8);
    for (int m = 0; m < ring.cnt; ++m) s16_mma_step<C, NT>(a, ring, ks + int64_t{kWarps} * m, g, t, mis0, mis1, acc);
    write_mma_tile<NT, SW, kConv>(a, mma_red<NT, SW>(red, j), acc, tile, g, t, ks, ct);
  }
  cp_async_wait<0>();
}

// s16_mma_body on warp tiles, for shapes with many more 16-row tiles than warps (the output head: 15520
// tiles for 2112 warps on an H200): a warp walks every step of tiles of its own, so a tile's end needs
// no partial sums through shared memory and no barriers (~80 of a Q6_K warp-step's ~800 instructions in
// the block form, whose kernels are issue-bound at several tokens: PERFORMANCE.md "Session 48"). The
// same bits: the steps run in the block form's warp order (v, v + 8, .. for v = 0..7), each v's sum
// from zero, and the sums are added to the output in turn as write_tile adds the warps' partials.
// a.n_out: a multiple of 16 x the launch's warps (every warp takes as many tiles). One and two n-tiles
// only: at three the sums spill (84 bytes at 128 registers; 17 tokens 8% slower), and kept in shared
// memory instead they lost at 18-23 tokens what they won at 24 (PERFORMANCE.md "Session 51").
template <class C, int NT, bool kTma = false>
__device__ __forceinline__ void s16_mma_warp_tiles(const Int8MvArgs& a, uint8_t* smem, BlockSlot slot,
                                                   const TmaMaps* maps = nullptr) {
  using L = typename C::L;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  std::conditional_t<kTma, TmaStepRing<L, false, false, true, true>, StepRing<L, false, true, true>> ring(a, smem, slot,
                                                                                                        maps);
  const int64_t my_tiles = ring.my_tiles;
  const int S = ring.cnt;
  ring.prime();
  pdl_wait();
  pdl_trigger();
  for (int64_t j = 0; j < my_tiles; ++j) {
    const int64_t tile = ring.tile(j);
    float out[NT][4], acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[nt][e] = acc[nt][e] = 0.0f;
    const int mis0 = ring.row_misalignment(tile, g), mis1 = ring.row_misalignment(tile, g + 8);
    int s = 0, v = 0;  // the step's super-block, and the block form's warp that would take it
    for (int m = 0; m < S; ++m) {
      s16_mma_step<C, NT>(a, ring, s, g, t, mis0, mis1, acc);
      s += kWarps;
      if (s >= S) {  // warp v's partial, added as sum_partials adds it
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) out[nt][e] += acc[nt][e], acc[nt][e] = 0.0f;
        s = ++v;
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * t + (e & 1);
        const int64_t row = tile * kRows + g + (e >= 2 ? 8 : 0);
        if (c < a.n) a.y[c * a.y_stride + row] = out[nt][e];
      }
  }
  cp_async_wait<0>();
}

// The kernels of one matvec: every block of the launch serves it.
__device__ __forceinline__ BlockSlot launch_slot() {
  return BlockSlot{static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x)};
}
template <int NMAX, bool SW, bool Q5 = false, bool kConv = false, int kXFold = kStageNone>
__global__ void __launch_bounds__(kWarps * 32, 2) q4k_dp4a_kernel(Int8MvArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  q4k_dp4a_body<NMAX, SW, Q5, false, kConv, kXFold>(a, smem, launch_slot());
}
template <int NT, bool SW, bool Q5 = false, int MB = (NT >= 4 ? 1 : 2)>
__global__ void __launch_bounds__(kWarps * 32, MB) q4k_mma_kernel(Int8MvArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  q4k_mma_body<NT, SW, Q5>(a, smem, launch_slot());
}
// The Q4_K kernels with the weights by TMA boxes (sm_90: use_tma_ring): the mbarriers first, then the
// cp.async kernels' shared memory.
template <int NMAX, bool SW, bool kConv = false, int kXFold = kStageNone>
__global__ void __launch_bounds__(kWarps * 32, 2) q4k_dp4a_tma_kernel(Int8MvArgs a, const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(128) uint8_t tma_smem[];  // (the dynamic shared memory, named for its alignment)
  q4k_dp4a_body<NMAX, SW, false, false, kConv, kXFold, true>(a, tma_smem + kTmaBarBytes, launch_slot(), &maps);
}
template <int NT, bool SW, int MB = (NT >= 4 ? 1 : 2), int kStages = 2>
__global__ void __launch_bounds__(kWarps * 32, MB) q4k_mma_tma_kernel(Int8MvArgs a, const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(128) uint8_t tma_smem[];  // (the dynamic shared memory, named for its alignment)
  q4k_mma_body<NT, SW, false, false, true, kStages>(a, tma_smem + kTmaBarBytesFor<kStages>, launch_slot(), &maps);
}
template <class C, int NMAX, bool SW, bool kConv = false, int kXFold = kStageNone>
__global__ void __launch_bounds__(kWarps * 32, 2) s16_dp4a_kernel(Int8MvArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  s16_dp4a_body<C, NMAX, SW, false, kConv, kXFold>(a, smem, launch_slot());
}
template <class C, int NT, bool SW, int MB = (NT >= 4 ? 1 : 2)>
__global__ void __launch_bounds__(kWarps * 32, MB) s16_mma_kernel(Int8MvArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  s16_mma_body<C, NT, SW>(a, smem, launch_slot());
}
// Rows 0..warp_rows-1 on warp tiles, the rest (fewer tiles than the launch has warps) in the block form.
// A warp's ring is its own in both (the block form's partial sums come after the rings), so no barrier.
// kTma: both by TMA, the rest's tiles from maps[1] (the map of those rows).
template <class C, int NT, bool kTma>
__device__ __forceinline__ void s16_mma_wt_parts(const Int8MvArgs& a, int64_t warp_rows, uint8_t* smem,
                                                 const TmaMaps* maps) {
  Int8MvArgs part = a;
  part.n_out = warp_rows;
  s16_mma_warp_tiles<C, NT, kTma>(part, smem, launch_slot(), maps);
  if (warp_rows == a.n_out) return;
  part.w = a.w + warp_rows * static_cast<int64_t>(a.row_bytes);
  part.y = a.y + warp_rows;
  part.n_out = a.n_out - warp_rows;
  s16_mma_body<C, NT, false, false, kTma>(part, smem, launch_slot(), kTma ? maps + 1 : nullptr);
}
template <class C, int NT>
__global__ void __launch_bounds__(kWarps * 32, 2) s16_mma_wt_kernel(Int8MvArgs a, int64_t warp_rows) {
  extern __shared__ __align__(16) uint8_t smem[];
  s16_mma_wt_parts<C, NT, false>(a, warp_rows, smem, nullptr);
}
// (maps[0]: the weights, maps[1]: the rows from warp_rows on)
struct TmaMapPair {
  TmaMaps m[2];
};
template <class C, int NT>
__global__ void __launch_bounds__(kWarps * 32, 2) s16_mma_wt_tma_kernel(Int8MvArgs a, int64_t warp_rows,
                                                                        const __grid_constant__ TmaMapPair maps) {
  extern __shared__ __align__(128) uint8_t tma_smem[];  // (the dynamic shared memory, named for its alignment)
  s16_mma_wt_parts<C, NT, true>(a, warp_rows, tma_smem + kTmaBarBytes, maps.m);
}
template <class C, int NT, bool SW, int MB = (NT >= 4 ? 1 : 2)>
__global__ void __launch_bounds__(kWarps * 32, MB) s16_mma_tma_kernel(Int8MvArgs a, const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(128) uint8_t tma_smem[];  // (the dynamic shared memory, named for its alignment)
  s16_mma_body<C, NT, SW, false, true>(a, tma_smem + kTmaBarBytes, launch_slot(), &maps);
}
template <class C, int NMAX, bool SW, bool kConv = false, int kXFold = kStageNone>
__global__ void __launch_bounds__(kWarps * 32, 2) s16_dp4a_tma_kernel(Int8MvArgs a, const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(128) uint8_t tma_smem[];  // (the dynamic shared memory, named for its alignment)
  s16_dp4a_body<C, NMAX, SW, false, kConv, kXFold, true>(a, tma_smem + kTmaBarBytes, launch_slot(), &maps);
}

// Several matvecs of one input in one launch (int8_matvec_multi_launch): blocks first[i] ..
// first[i + 1] - 1 serve part i (Q4_K, or Q6_K where s16[i]) as a launch of their own would, so each
// row gets the bits of its own matmul. W: the dp4a kernels' NMAX, or the tensor-core kernels' NT.
struct Int8MvParts {
  Int8MvArgs a[kInt8MvMaxParts];
  int first[kInt8MvMaxParts + 1];
  bool s16[kInt8MvMaxParts];
  bool s16_tma[kInt8MvMaxParts] = {};  // a Q6_K part's weights by TMA boxes (multi_tma_kernel; rows of a 16-byte multiple)
  int n;
};
// A Q6_K part's body (kTma: by the TMA boxes of maps[i].w).
template <int W, bool kDp4a, bool kConv, int kXFold, bool kTma>
__device__ __forceinline__ void multi_s16(const Int8MvArgs& a, uint8_t* smem, BlockSlot slot, const TmaMaps* map) {
  if constexpr (kDp4a) s16_dp4a_body<Q6KCodes, W, false, false, kConv, kXFold, kTma>(a, smem, slot, map);
  else s16_mma_body<Q6KCodes, W, false, kConv, kTma>(a, smem, slot, map);
}
// The parts' blocks as multi_kernel and multi_tma_kernel share them out. kTma: the Q4_K parts' weights by
// TMA boxes (maps[i].w; the mbarriers in the kTmaBarBytes below smem), and the Q6_K parts' where s16_tma.
template <int W, bool kDp4a, bool kConv, int kXFold, bool kTma>
__device__ __forceinline__ void multi_body(const Int8MvParts& p, uint8_t* smem, const TmaMaps* maps) {
  const int b = static_cast<int>(blockIdx.x);
  int i = 0;
  while (i + 1 < p.n && b >= p.first[i + 1]) ++i;
  const BlockSlot slot{b - p.first[i], p.first[i + 1] - p.first[i]};
  const TmaMaps* const map = kTma ? maps + i : nullptr;
  if (p.s16[i]) {
    if (kTma && p.s16_tma[i]) multi_s16<W, kDp4a, kConv, kXFold, kTma>(p.a[i], smem, slot, map);
    else multi_s16<W, kDp4a, kConv, kXFold, false>(p.a[i], smem, slot, nullptr);
  } else if constexpr (kDp4a) {
    q4k_dp4a_body<W, false, false, false, kConv, kXFold, kTma>(p.a[i], smem, slot, map);
  } else {
    q4k_mma_body<W, false, false, kConv, kTma>(p.a[i], smem, slot, map);
  }
}
template <int W, bool kDp4a, bool kConv = false, int kXFold = kStageNone>
__global__ void __launch_bounds__(kWarps * 32, 2) multi_kernel(const __grid_constant__ Int8MvParts p) {
  extern __shared__ __align__(16) uint8_t smem[];
  multi_body<W, kDp4a, kConv, kXFold, false>(p, smem, nullptr);
}
// (.up unused: no SwiGLU part)
struct Int8MvPartMaps {
  TmaMaps m[kInt8MvMaxParts];
};
template <int W, bool kDp4a, bool kConv = false, int kXFold = kStageNone>
__global__ void __launch_bounds__(kWarps * 32, 2) multi_tma_kernel(const __grid_constant__ Int8MvParts p,
                                                                   const __grid_constant__ Int8MvPartMaps maps) {
  extern __shared__ __align__(128) uint8_t tma_smem[];  // (the dynamic shared memory, named for its alignment)
  multi_body<W, kDp4a, kConv, kXFold, true>(p, tma_smem + kTmaBarBytes, maps.m);
}

// Scratch: q, then d, then bs, each 256-byte aligned, for padded_tokens(n) rows.
size_t q_bytes(int64_t n, int64_t K) { return align_up(static_cast<size_t>(padded_tokens(n) * K), 256); }
size_t d_bytes(int64_t n, int64_t K) {
  return align_up(static_cast<size_t>(padded_tokens(n) * (K / 256)) * sizeof(float), 256);
}
size_t bs_bytes(int64_t n, int64_t K) {
  return align_up(static_cast<size_t>(padded_tokens(n) * (K / 16)) * sizeof(__half), 256);
}

// Whether the dp4a kernels' shared memory fits the device (not on sm_86/89's 99 KB for Q6_K; the
// tensor-core kernels, which give the same bits, take those widths there).
template <class L>
bool dp4a_fits() {
  static const bool fits = [] {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return smem_bytes<L>(2, true) <= static_cast<size_t>(optin);
  }();
  return fits;
}

// The share of a launch's block slots that its tiles fill: tiles over slots blocks, in whole rounds.
double wave_fill(int64_t tiles, int64_t slots) {
  const int64_t rounds = (tiles + slots - 1) / slots;
  return static_cast<double>(tiles) / static_cast<double>(rounds * slots);
}

// maps: a TMA kernel's (q4k_dp4a_tma_kernel, q4k_mma_tma_kernel, s16_mma_tma_kernel) tensor maps, its
// mbarriers' bytes added.
// extra: more shared memory (a deeper TMA ring's stages and barriers).
template <class L, int NMAX, auto kernel, int MB = 2>
cudaError_t launch(Int8MvArgs a, bool sw, cudaStream_t stream, bool staged = false, const TmaMaps* maps = nullptr,
                   size_t extra = 0) {
  // (a tensor-core kernel's NT = NMAX / 8; the dp4a kernels' NMAX of 1 or 2 keep one buffer)
  const int red_buffers = sw ? kMmaRedBuffers<NMAX / 8, true> : kMmaRedBuffers<NMAX / 8, false>;
  constexpr bool kTma = std::is_invocable_v<decltype(kernel), Int8MvArgs, TmaMaps>;
  size_t smem = smem_bytes<L>(NMAX, staged, red_buffers) + (kTma ? kTmaBarBytes : 0) + extra;
  static const cudaError_t attr_err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr_err != cudaSuccess) return attr_err;
  const int64_t out = sw ? kRows / 2 : kRows, tiles = (a.n_out + out - 1) / out, sms = sm_count();
  int64_t blocks = std::min<int64_t>(tiles, MB * sms);
  // A dp4a launch whose tiles fill two blocks an SM in rounds badly (the 27B's 320-tile projections to 5120:
  // two rounds at 61% of the slots) takes three an SM where they fit (the staged x sized to its row, not
  // kMaxStagedX; no conv tile after it): one round at 81%. Each tile's arithmetic is the same in any block, so
  // the bits are too. HYSPEC_MATVEC_WAVES=0: two an SM; =2: three wherever they fit and the tiles outnumber two
  // an SM (A/B switches, read at each launch; 2 gained nothing on the 9B, its head or the MoE: PERFORMANCE.md
  // "Session 56").
  const int waves = env_int("HYSPEC_MATVEC_WAVES", 1);
  if (staged && MB == 2 && extra == 0 && tiles > MB * sms && waves != 0 &&
      (waves == 2 || wave_fill(tiles, 3 * sms) > wave_fill(tiles, MB * sms) + 0.05)) {
    const size_t sized = smem_bytes<L>(NMAX, false, red_buffers) + (staged_x_bytes(a.n, a.K) + 15) / 16 * 16 +
                         (kTma ? kTmaBarBytes : 0);
    // (the occupancy by shared memory, asked once per size: an eager step launches these every token)
    static std::mutex mu;
    static std::map<size_t, int> blocks_per_sm;
    int per_sm = 0;
    {
      const std::lock_guard<std::mutex> lock(mu);
      if (const auto it = blocks_per_sm.find(sized); it != blocks_per_sm.end()) {
        per_sm = it->second;
      } else if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, sized) == cudaSuccess) {
        blocks_per_sm.emplace(sized, per_sm);
      } else {
        cudaGetLastError();  // (the query's own error: the launch keeps two blocks an SM)
        per_sm = 0;
      }
    }
    if (per_sm >= 3) smem = sized, blocks = std::min<int64_t>(tiles, 3 * sms);
  }
  const dim3 grid(static_cast<unsigned>(blocks));
  if constexpr (kTma) return launch_pdl(kernel, grid, dim3(kWarps * 32), smem, stream, a, *maps);
  else return launch_pdl(kernel, grid, dim3(kWarps * 32), smem, stream, a);
}

// The driver's cuTensorMapEncodeTiled, or null where the driver has none.
using TensorMapEncoder = PFN_cuTensorMapEncodeTiled_v12000;
TensorMapEncoder tensor_map_encoder() {
  static const TensorMapEncoder encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const bool ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
                        cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<TensorMapEncoder>(fn) : nullptr;
  }();
  return encode;
}
// The tensor map of a weight at w of layout L (TmaStepRing), boxes of box_rows rows: a 16-byte multiple
// block's 3D map [rows][super-blocks][block bytes], box {block bytes, 1, box_rows}; else (Q6_K) a 2D map
// [rows][row bytes], box {slot bytes, box_rows}, or, rows 8 bytes past a 16-byte multiple, a map of row pairs
// [rows/2][2 x row bytes]. False where the driver cannot make one (the address not 16-byte aligned, row bytes
// neither a 16-byte multiple nor a pair of them) or pairs do not fit (below). Made once a weight (address,
// shape, layout and box) and kept.
template <class L>
bool weight_tensor_map(const uint8_t* w, int64_t n_out, int64_t K, size_t row_bytes, int box_rows, CUtensorMap* out) {
  const TensorMapEncoder encode = tensor_map_encoder();
  // Row pairs (Q6_K, row_group_log2): whole pairs, and each parity's box (box_rows / 2 slot rows) landing at a
  // 128-byte multiple, as a box's destination needs (so plain launches only, not SwiGLU's 8-row halves).
  // HYSPEC_TMA_Q6K_PAIRS=0: none (an A/B switch: their cp.async ring).
  const int lg = L::kAligned ? (row_bytes % 16 == 0 ? 0 : -1) : row_group_log2(row_bytes);
  if (!encode || (reinterpret_cast<uintptr_t>(w) & 15) != 0 || lg < 0 ||
      (lg == 1 && (n_out % 2 != 0 || (box_rows / 2 * L::kSlotBytes) % 128 != 0 ||
                   env_int("HYSPEC_TMA_Q6K_PAIRS", 1) == 0)))
    return false;
  static std::mutex mu;
  static std::map<std::tuple<const void*, int64_t, int64_t, int>, CUtensorMap> made;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(static_cast<const void*>(w), n_out, K, box_rows);
  if (const auto it = made.find(key); it != made.end()) return *out = it->second, true;
  constexpr cuuint32_t kBlock = L::kBlockBytes;
  const cuuint32_t rows = static_cast<cuuint32_t>(box_rows), unit[3] = {1, 1, 1};
  // HYSPEC_TMA_L2_PROMOTION (an A/B switch, read once): 0, 64, 128 (default) or 256 bytes
  static const CUtensorMapL2promotion promotion = [] {
    switch (env_int("HYSPEC_TMA_L2_PROMOTION", 128)) {
      case 0: return CU_TENSOR_MAP_L2_PROMOTION_NONE;
      case 64: return CU_TENSOR_MAP_L2_PROMOTION_L2_64B;
      case 256: return CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
      default: return CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    }
  }();
  CUtensorMap map;
  CUresult made_ok;
  if constexpr (L::kAligned) {
    const cuuint64_t dims[3] = {kBlock, static_cast<cuuint64_t>(K / 256), static_cast<cuuint64_t>(n_out)};
    const cuuint64_t strides[2] = {kBlock, row_bytes};
    const cuuint32_t box[3] = {kBlock, 1, rows};
    made_ok = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<uint8_t*>(w), dims, strides, box, unit,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, promotion,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  } else {
    const cuuint64_t dims[2] = {row_bytes << lg, static_cast<cuuint64_t>(n_out >> lg)};
    const cuuint64_t strides[1] = {row_bytes << lg};
    const cuuint32_t box[2] = {static_cast<cuuint32_t>(L::kSlotBytes), rows >> lg};
    made_ok = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(w), dims, strides, box, unit,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, promotion,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  if (made_ok != CUDA_SUCCESS) return false;
  made.emplace(key, map);
  return *out = map, true;
}
// A launch's maps (sw: the gate's and the up weights', 8 rows a box), or false: the cp.async kernels.
template <class L>
bool tensor_maps(const Int8MvArgs& a, bool sw, bool dp4a, TmaMaps* maps) {
  // Row pairs on the tensor-core kernels only: on the one- and two-row dp4a kernels they lost 0.5-3.4% at the
  // 27B's FFN shapes (PERFORMANCE.md "Session 54").
  if (dp4a && row_group_log2(a.row_bytes) == 1) return false;
  const int box_rows = sw ? kRows / 2 : kRows;
  return weight_tensor_map<L>(a.w, a.n_out, a.K, a.row_bytes, box_rows, &maps->w) &&
         (!sw || weight_tensor_map<L>(a.w2, a.n_out, a.K, a.row_bytes, box_rows, &maps->up));
}
bool sm90() {
  static const bool is = [] {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    return major >= 9;
  }();
  return is;
}
// Whether a launch of n rows (dp4a: on the dp4a kernels) takes the TMA kernels: on sm_90 unless
// HYSPEC_TMA_RING=0 (an A/B switch, read at each launch so that a test can set it). The one-n-tile
// tensor-core kernel (3..8 rows) only where K has nt1_min_blocks super-blocks (-1: HYSPEC_TMA_NT1_MIN_BLOCKS,
// default 0: every K). On a two-stage ring TMA made Q4_K 4096 x 12288 7% slower at 8 rows (session 52); the
// three-stage ring that kernel now takes (tma_third_stage) is faster than the cp.async ring there (session 53).
bool use_tma_ring(int64_t n, bool dp4a, int64_t K, int nt1_min_blocks = -1) {
  if (!sm90() || env_int("HYSPEC_TMA_RING", 1) == 0) return false;
  if (nt1_min_blocks < 0) nt1_min_blocks = env_int("HYSPEC_TMA_NT1_MIN_BLOCKS", 0);
  return dp4a || n > 8 || K / 256 >= nt1_min_blocks;
}

// Q4_K's one-n-tile tensor-core TMA kernel (3..8 rows, plain and SwiGLU) runs a three-stage ring: a warp has
// few steps a tile, and a third box in flight hides a box's latency (4096 x 4096 at 8 rows 1359 -> 1487 GB/s;
// the 9B's verify-2 -0.8%, verify-4 -0.6%, session 53). Elsewhere two: a third stage lost 5-10% at 16 rows,
// gained nothing at one and two, and made Q6_K's one-n-tile kernels 2-3.5% slower (the head's warp tiles
// too; verify-2 +1.3%). HYSPEC_TMA_STAGES=2 keeps two there too (an A/B switch). kThirdStageBytes<L>: the
// shared memory a third stage adds.
bool tma_third_stage() { return env_int("HYSPEC_TMA_STAGES", 3) != 2; }
template <class L>
constexpr size_t kThirdStageBytes = kWarps * kRows * L::kSlotBytes + kTmaBarBytesFor<3> - kTmaBarBytes;

// The tensor-core kernel for n rows: f(std::integral_constant<int, NT>) with NT n-tiles of 8 rows (four, 25..32
// rows, without SwiGLU only).
template <bool SW, class F>
cudaError_t by_n_tiles(int64_t n, F&& f) {
  if (n <= 8) return f(std::integral_constant<int, 1>{});
  if (n <= 16) return f(std::integral_constant<int, 2>{});
  if (n <= 24) return f(std::integral_constant<int, 3>{});
  if constexpr (!SW) return f(std::integral_constant<int, 4>{});
  return cudaErrorInvalidValue;
}

// One Q4_K kernel of the ring kTma picks (the TMA kernels: Q4_K only).
template <int NMAX, bool SW, bool Q5, bool kConv, int kXFold, bool kTma>
cudaError_t launch_q4k_dp4a(const Int8MvArgs& a, cudaStream_t stream, const TmaMaps* maps) {
  using L = std::conditional_t<Q5, Q5KLayout, Q4KLayout>;
  if constexpr (kTma) return launch<L, NMAX, q4k_dp4a_tma_kernel<NMAX, SW, kConv, kXFold>>(a, SW, stream, true, maps);
  else return launch<L, NMAX, q4k_dp4a_kernel<NMAX, SW, Q5, kConv, kXFold>>(a, SW, stream, true);
}
template <int NT, bool SW, bool Q5, bool kTma>
cudaError_t launch_q4k_mma(const Int8MvArgs& a, cudaStream_t stream, const TmaMaps* maps) {
  using L = std::conditional_t<Q5, Q5KLayout, Q4KLayout>;
  constexpr int MB = NT >= 4 ? 1 : 2;
  if constexpr (kTma) {
    if constexpr (NT == 1) {
      if (tma_third_stage())
        return launch<L, 8, q4k_mma_tma_kernel<1, SW, MB, 3>, MB>(a, SW, stream, false, maps, kThirdStageBytes<L>);
    }
    return launch<L, NT * 8, q4k_mma_tma_kernel<NT, SW, MB>, MB>(a, SW, stream, false, maps);
  } else {
    return launch<L, NT * 8, q4k_mma_kernel<NT, SW, Q5, MB>, MB>(a, SW, stream);
  }
}

// dp4a: the one- or two-token kernel, else the tensor cores by width; every choice gives the same
// bits, so the switch is a speed choice only. kTma: the weights by TMA boxes (maps).
template <bool SW, bool Q5, bool kTma>
cudaError_t launch_q4k_rings(const Int8MvArgs& a, bool dp4a, cudaStream_t stream, const TmaMaps* maps) {
  const int n = a.n;
  if constexpr (SW && !Q5) {
    if (dp4a && a.xfold.kind == Int8XFold::kRmsNorm)
      return launch_q4k_dp4a<1, true, false, false, kStageNorm, kTma>(a, stream, maps);  // (n = 1)
  }
  if constexpr (!SW && !Q5) {
    if (dp4a && a.xfold.kind == Int8XFold::kRmsNorm)  // (n = 1)
      return a.conv_y ? launch_q4k_dp4a<1, false, false, true, kStageNorm, kTma>(a, stream, maps)
                      : launch_q4k_dp4a<1, false, false, false, kStageNorm, kTma>(a, stream, maps);
  }
  if constexpr (!SW) {
    if (dp4a && a.conv_y) return launch_q4k_dp4a<1, false, Q5, true, kStageNone, kTma>(a, stream, maps);  // (n = 1)
    if (dp4a && a.xfold.kind == Int8XFold::kPlain)
      return launch_q4k_dp4a<1, false, Q5, false, kStagePlain, kTma>(a, stream, maps);  // (n = 1)
    if (dp4a && a.xfold.kind != Int8XFold::kNone)
      return launch_q4k_dp4a<1, false, Q5, false, kStageFold, kTma>(a, stream, maps);  // (n = 1)
  }
  if (dp4a) return n == 1 ? launch_q4k_dp4a<1, SW, Q5, false, kStageNone, kTma>(a, stream, maps)
                          : launch_q4k_dp4a<2, SW, Q5, false, kStageNone, kTma>(a, stream, maps);
  return by_n_tiles<SW>(n, [&](auto nt) { return launch_q4k_mma<decltype(nt)::value, SW, Q5, kTma>(a, stream, maps); });
}
template <bool SW, bool Q5>
cudaError_t launch_q4k(Int8MvArgs a, bool dp4a, cudaStream_t stream) {
  if constexpr (!Q5) {
    TmaMaps maps;
    if (use_tma_ring(a.n, dp4a, a.K) && tensor_maps<Q4KLayout>(a, SW, dp4a, &maps))
      return launch_q4k_rings<SW, false, true>(a, dp4a, stream, &maps);
  }
  return launch_q4k_rings<SW, Q5, false>(a, dp4a, stream, nullptr);
}
// Blocks for a Q6_K launch of 3..16 tokens on warp tiles (s16_mma_wt_kernel), or 0 for the block form:
// at least two whole tiles a warp of the usual grid. HYSPEC_WARP_TILES=0: never; =B: on B blocks whenever
// each of their warps gets a tile (tests; the bits do not depend on the grid).
int64_t warp_tile_blocks(int64_t full_tiles) {
  const int forced = env_int("HYSPEC_WARP_TILES", -1);
  if (forced == 0) return 0;
  const int64_t blocks = forced > 0 ? forced : 2 * int64_t{sm_count()};
  return full_tiles / (blocks * kWarps) >= (forced > 0 ? 1 : 2) ? blocks : 0;
}
// tma: the weights' map (maps->w), or null: the cp.async kernel.
template <class C, int NT>
cudaError_t launch_s16_wt(Int8MvArgs a, int64_t blocks, cudaStream_t stream, const TmaMaps* tma = nullptr) {
  using L = typename C::L;
  const int64_t warps = blocks * kWarps, warp_rows = a.n_out / kRows / warps * warps * kRows;
  const size_t smem = smem_bytes<L>(NT * 8, false);
  TmaMapPair maps{};
  if (tma) maps.m[0] = *tma;
  if (tma && (warp_rows == a.n_out || weight_tensor_map<L>(a.w + warp_rows * static_cast<int64_t>(a.row_bytes),
                                                             a.n_out - warp_rows, a.K, a.row_bytes, kRows, &maps.m[1].w))) {
    static const cudaError_t attr_err = cudaFuncSetAttribute(
        s16_mma_wt_tma_kernel<C, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem + kTmaBarBytes));
    if (attr_err != cudaSuccess) return attr_err;
    return launch_pdl(s16_mma_wt_tma_kernel<C, NT>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32),
                      smem + kTmaBarBytes, stream, a, warp_rows, maps);
  }
  static const cudaError_t attr_err =
      cudaFuncSetAttribute(s16_mma_wt_kernel<C, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr_err != cudaSuccess) return attr_err;
  return launch_pdl(s16_mma_wt_kernel<C, NT>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), smem, stream, a,
                    warp_rows);
}

// One Q6_K/Q3_K/IQ4_XS kernel of the ring kTma picks (the TMA kernels: Q6_K only).
template <class C, int NMAX, bool SW, bool kConv, int kXFold, bool kTma>
cudaError_t launch_s16_dp4a(const Int8MvArgs& a, cudaStream_t stream, const TmaMaps* maps) {
  using L = typename C::L;
  if constexpr (kTma) return launch<L, NMAX, s16_dp4a_tma_kernel<C, NMAX, SW, kConv, kXFold>>(a, SW, stream, true, maps);
  else return launch<L, NMAX, s16_dp4a_kernel<C, NMAX, SW, kConv, kXFold>>(a, SW, stream, true);
}
// The tensor-core kernel of a's width (kTma: by TMA boxes, maps; Q6_K).
template <class C, bool SW, bool kTma>
cudaError_t launch_s16_mma(const Int8MvArgs& a, cudaStream_t stream, const TmaMaps* maps) {
  using L = typename C::L;
  return by_n_tiles<SW>(a.n, [&](auto nt) {
    constexpr int NT = decltype(nt)::value, MB = NT >= 4 ? 1 : 2;
    if constexpr (kTma) return launch<L, NT * 8, s16_mma_tma_kernel<C, NT, SW, MB>, MB>(a, SW, stream, false, maps);
    else return launch<L, NT * 8, s16_mma_kernel<C, NT, SW, MB>, MB>(a, SW, stream);
  });
}
template <class C, bool SW, bool kTma>
cudaError_t launch_s16_rings(const Int8MvArgs& a, bool dp4a, cudaStream_t stream, const TmaMaps* maps) {
  const int n = a.n;
  if constexpr (!SW && std::is_same_v<C, Q6KCodes>) {
    if (!dp4a && n <= 16) {
      if (const int64_t blocks = warp_tile_blocks(a.n_out / kRows))
        return n <= 8 ? launch_s16_wt<C, 1>(a, blocks, stream, maps) : launch_s16_wt<C, 2>(a, blocks, stream, maps);
    }
    if (dp4a && a.xfold.kind == Int8XFold::kRmsNorm)  // (n = 1)
      return a.conv_y ? launch_s16_dp4a<C, 1, false, true, kStageNorm, kTma>(a, stream, maps)
                      : launch_s16_dp4a<C, 1, false, false, kStageNorm, kTma>(a, stream, maps);
    if (dp4a && a.conv_y) return launch_s16_dp4a<C, 1, false, true, kStageNone, kTma>(a, stream, maps);  // (n = 1)
    if (dp4a && a.xfold.kind == Int8XFold::kPlain)
      return launch_s16_dp4a<C, 1, false, false, kStagePlain, kTma>(a, stream, maps);  // (n = 1)
    if (dp4a && a.xfold.kind != Int8XFold::kNone)
      return launch_s16_dp4a<C, 1, false, false, kStageFold, kTma>(a, stream, maps);  // (n = 1)
  }
  if (dp4a) return n == 1 ? launch_s16_dp4a<C, 1, SW, false, kStageNone, kTma>(a, stream, maps)
                          : launch_s16_dp4a<C, 2, SW, false, kStageNone, kTma>(a, stream, maps);
  return launch_s16_mma<C, SW, kTma>(a, stream, maps);
}
// HYSPEC_TMA_Q6K: 0 the cp.async ring; 1 TMA as Q4_K takes it; 2 (default) TMA at every width. The one- and
// two-row kernels too unless HYSPEC_TMA_Q6K_DP4A=0.
template <class C, bool SW>
cudaError_t launch_s16(Int8MvArgs a, bool dp4a, cudaStream_t stream) {
  if constexpr (std::is_same_v<C, Q6KCodes>) {
    const int q6 = env_int("HYSPEC_TMA_Q6K", 2);
    TmaMaps maps;
    if (q6 != 0 && (!dp4a || env_int("HYSPEC_TMA_Q6K_DP4A", 1) != 0) &&
        use_tma_ring(a.n, dp4a, a.K, q6 == 2 ? 0 : -1) && tensor_maps<typename C::L>(a, SW, dp4a, &maps))
      return launch_s16_rings<C, SW, true>(a, dp4a, stream, &maps);
  }
  return launch_s16_rings<C, SW, false>(a, dp4a, stream, nullptr);
}

// The int8 matvec's weight types as kernel families: the ring layout, the activations' order for the
// tensor-core kernels, and the launch (sw: fused SwiGLU).
template <bool Q5>
struct Q4KFamily {
  using L = std::conditional_t<Q5, Q5KLayout, Q4KLayout>;
  static constexpr XOrder kOrder = XOrder::kFragQ4;
  static cudaError_t launch(Int8MvArgs a, bool sw, bool dp4a, cudaStream_t stream) {
    return sw ? launch_q4k<true, Q5>(a, dp4a, stream) : launch_q4k<false, Q5>(a, dp4a, stream);
  }
  template <int NMAX, bool SW, bool WT, bool kTma = false>
  __device__ static void dp4a_body(const Int8MvArgs& a, uint8_t* smem, BlockSlot slot, const TmaMaps* maps = nullptr) {
    q4k_dp4a_body<NMAX, SW, Q5, WT, false, kStageNone, kTma>(a, smem, slot, maps);
  }
};
template <class C>
struct S16Family {
  using L = typename C::L;
  static constexpr XOrder kOrder = XOrder::kFragQ6;
  static cudaError_t launch(Int8MvArgs a, bool sw, bool dp4a, cudaStream_t stream) {
    return sw ? launch_s16<C, true>(a, dp4a, stream) : launch_s16<C, false>(a, dp4a, stream);
  }
  template <int NMAX, bool SW, bool WT, bool kTma = false>
  __device__ static void dp4a_body(const Int8MvArgs& a, uint8_t* smem, BlockSlot slot, const TmaMaps* maps = nullptr) {
    s16_dp4a_body<C, NMAX, SW, WT, false, kStageNone, kTma>(a, smem, slot, maps);
  }
};
// f(family) for a type of the int8 matvec; false for any other.
template <class F>
bool with_int8_family(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::Q4_K: f(Q4KFamily<false>{}); return true;
    case GgmlType::Q5_K: f(Q4KFamily<true>{}); return true;
    case GgmlType::Q6_K: f(S16Family<Q6KCodes>{}); return true;
    case GgmlType::Q3_K: f(S16Family<Q3KCodes>{}); return true;
    case GgmlType::IQ4_XS: f(S16Family<Iq4XsCodes>{}); return true;
    default: return false;
  }
}

// Widths up to HYSPEC_MV8_DP4A (default 2) take the dp4a kernel where x fits in its shared memory.
template <class L>
bool use_dp4a(int64_t n, int64_t K) {
  static const int dp4a_max = env_int("HYSPEC_MV8_DP4A", 2);
  return n <= dp4a_max && n <= 2 && staged_x_bytes(n, K) <= kMaxStagedX && dp4a_fits<L>();
}

// Blocks per part of a multi launch: the fewest that finish every part within the smallest makespan
// (whole 16-row tiles per block, tile_cost each), with at most `grid` blocks in all. Returns the
// blocks of each part in g, or false when even one block each does not fit.
bool share_blocks(const int64_t* tiles, const int64_t* tile_cost, int parts, int64_t grid, int64_t* g) {
  auto blocks_for = [&](int64_t span, int64_t* out) {  // no block's tiles cost more than span
    int64_t total = 0;
    for (int i = 0; i < parts; ++i) {
      const int64_t per_block = span / tile_cost[i];
      if (per_block == 0) return false;
      out[i] = (tiles[i] + per_block - 1) / per_block;
      total += out[i];
    }
    return total <= grid;
  };
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < parts; ++i) hi = std::max(hi, tiles[i] * tile_cost[i]);
  if (!blocks_for(hi, g)) return false;
  while (hi - lo > 1) {  // blocks_for(hi) holds, blocks_for(lo) does not
    const int64_t mid = lo + (hi - lo) / 2;
    int64_t tmp[kInt8MvMaxParts];
    (blocks_for(mid, tmp) ? hi : lo) = mid;
  }
  return blocks_for(hi, g);
}

// The Q4_K parts' tensor maps, or false where one cannot be made; the Q6_K parts' where one can (s16_tma),
// unless HYSPEC_TMA_MULTI_Q6K=0 (an A/B switch: their cp.async ring).
bool multi_tensor_maps(Int8MvParts& p, bool dp4a, Int8MvPartMaps& maps) {
  const bool q6 = env_int("HYSPEC_TMA_MULTI_Q6K", 1) != 0;
  for (int i = 0; i < p.n; ++i) {
    if (p.s16[i]) p.s16_tma[i] = q6 && tensor_maps<Q6KLayout>(p.a[i], false, dp4a, &maps.m[i]);
    else if (!tensor_maps<Q4KLayout>(p.a[i], false, dp4a, &maps.m[i])) return false;
  }
  return true;
}
template <int W, bool kDp4a, bool kConv = false, int kXFold = kStageNone>
cudaError_t launch_multi(Int8MvParts p, int64_t grid, int nmax, cudaStream_t stream) {
  constexpr bool kConvRows = kConv && (!kDp4a || W > 1);  // (a several-row conv fold: its ConvTile)
  const size_t smem = std::max(smem_bytes<Q4KLayout>(nmax, kDp4a), smem_bytes<Q6KLayout>(nmax, kDp4a)) +
                      (kConvRows ? sizeof(ConvTile) : 0);
  Int8MvPartMaps maps;
  if (use_tma_ring(p.a[0].n, kDp4a, p.a[0].K) && multi_tensor_maps(p, kDp4a, maps)) {
    static const cudaError_t attr_err =
        cudaFuncSetAttribute(multi_tma_kernel<W, kDp4a, kConv, kXFold>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem + kTmaBarBytes));
    if (attr_err != cudaSuccess) return attr_err;
    return launch_pdl(multi_tma_kernel<W, kDp4a, kConv, kXFold>, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32),
                      smem + kTmaBarBytes, stream, p, maps);
  }
  static const cudaError_t attr_err = cudaFuncSetAttribute(multi_kernel<W, kDp4a, kConv, kXFold>,
                                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr_err != cudaSuccess) return attr_err;
  return launch_pdl(multi_kernel<W, kDp4a, kConv, kXFold>, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32), smem,
                    stream, p);
}

}  // namespace

bool int8_matvec_tma_available() { return sm90() && tensor_map_encoder() != nullptr; }

bool int8_matvec_supported(const WeightView& w, int64_t n) {
  return w.int8_matvec && with_int8_family(w.type, [](auto) {}) && w.n_in % 256 == 0 && n >= 1 && n <= kInt8MvMaxWidth;
}

size_t int8_matvec_scratch_bytes(const WeightView& w, int64_t n) {
  return q_bytes(n, w.n_in) + d_bytes(n, w.n_in) + bs_bytes(n, w.n_in);
}

size_t quantized_x_bytes() {
  const int64_t n = kInt8MvMaxWidth, K = kQuantizedXMaxK;
  return 3 * q_bytes(n, K) + d_bytes(n, K) + bs_bytes(n, K);
}

QuantizedX quantized_x_at(void* base) {
  char* p = static_cast<char*>(base);
  QuantizedX qx;
  for (int8_t*& q : qx.q) q = reinterpret_cast<int8_t*>(p), p += q_bytes(kInt8MvMaxWidth, kQuantizedXMaxK);
  qx.d = reinterpret_cast<float*>(p);
  qx.bs = reinterpret_cast<uint16_t*>(p + d_bytes(kInt8MvMaxWidth, kQuantizedXMaxK));
  return qx;
}

namespace {
// A one-row Q4_K/Q5_K/Q6_K launch on the dp4a kernels: the instantiations with a conv or x fold.
bool one_row_dp4a_kquant(const WeightView& w, int64_t n) {
  bool dp4a = false;
  if (n == 1 && int8_matvec_supported(w, n) &&
      (w.type == GgmlType::Q4_K || w.type == GgmlType::Q5_K || w.type == GgmlType::Q6_K))
    with_int8_family(w.type, [&](auto family) { dp4a = use_dp4a<typename decltype(family)::L>(n, w.n_in); });
  return dp4a;
}
// HYSPEC_PLAIN_IN_BLOCK=0: one-row dp4a launches past kInBlockMaxK inputs quantize x in a launch of its own.
bool plain_in_block() {
  static const bool on = env_int("HYSPEC_PLAIN_IN_BLOCK", 1) != 0;
  return on;
}
}  // namespace

bool int8_conv_fold_supported(const WeightView& w, int64_t n) { return one_row_dp4a_kquant(w, n); }

bool int8_xfold_supported(const WeightView& w, int64_t n) {
  return w.n_in <= kInt8XFoldMaxK && one_row_dp4a_kquant(w, n);
}

int int8_norm_fold_mode() {
  static const int mode = env_int("HYSPEC_NORM_FOLD", 1);
  return mode;
}

bool int8_norm_fold_row(int64_t K) {
  const int tpg = norm_threads_per_group(K);
  return (tpg == 512 && (K == 4096 || K == 6144)) || (tpg == 256 && K % 1024 == 0 && K <= kInt8XFoldMaxK);
}

bool int8_norm_fold_supported(const WeightView& w, bool swiglu, int64_t n, int64_t K) {
  const bool type_ok = swiglu ? w.type == GgmlType::Q4_K : (w.type == GgmlType::Q4_K || w.type == GgmlType::Q6_K);
  const int mode = int8_norm_fold_mode();
  return (swiglu ? mode != 0 : mode == 1) && type_ok && w.n_in == K && int8_norm_fold_row(K) &&
         one_row_dp4a_kquant(w, n);
}

bool int8_residual_supported(const WeightView& w, int64_t n) { return one_row_dp4a_kquant(w, n); }

cudaError_t int8_matvec_launch(const WeightView& w, const uint8_t* up, Mat x, Mat y, void* scratch,
                               cudaStream_t stream, const QuantizedX* qx, const Int8ConvFold* conv,
                               const Int8XFold* xfold, float* residual) {
  if (!int8_matvec_supported(w, x.rows)) return cudaErrorInvalidValue;
  const int64_t n = x.rows, K = w.n_in;
  Int8MvArgs a{w.data, up, w.row_bytes, w.n_out, K, Q8K{}, x.data, x.stride, static_cast<int>(n), y.data, y.stride};
  if (conv) {
    if (up || !int8_conv_fold_supported(w, n) || conv->channels > w.n_out) return cudaErrorInvalidValue;
    a.conv_w = conv->w, a.conv_state = conv->state, a.conv_y = conv->y, a.conv_channels = conv->channels;
  }
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (residual) {
    if (up || !int8_residual_supported(w, n)) return cudaErrorInvalidValue;
    a.residual = residual;
  }
  if (xfold && xfold->kind == Int8XFold::kRmsNorm) {  // the row's norm, in-block
    const Int8XFold& f = *xfold;
    if (qx || residual || (up && conv) || !int8_norm_fold_supported(w, up != nullptr, n, K) || !aligned(x.data) ||
        !aligned(f.y) || !aligned(f.norm_w))
      return cudaErrorInvalidValue;
    a.xfold = f;
    a.xfold.norm_threads = norm_threads_per_group(K);
  } else if (xfold && xfold->kind != Int8XFold::kNone) {  // x is quantized in-block, through the folded op
    const Int8XFold& f = *xfold;
    if (up || qx || conv || !int8_xfold_supported(w, n) || !aligned(x.data) || !aligned(f.gate) || !aligned(f.y) ||
        f.gate_group % 8 != 0 || f.gate_stride % 4 != 0 || (f.kind == Int8XFold::kGatedNorm && !aligned(f.norm_w)))
      return cudaErrorInvalidValue;
    a.xfold = f;
  } else if (!up && !qx && !conv && K > kInBlockMaxK && K <= kInt8PlainMaxK && plain_in_block() &&
             one_row_dp4a_kquant(w, n)) {
    a.xfold.kind = Int8XFold::kPlain;  // (one row past kInBlockMaxK: staged in rounds, no quantize launch)
  }
  cudaError_t err = cudaErrorInvalidValue;
  with_int8_family(w.type, [&](auto family) {
    using Family = decltype(family);
    const bool dp4a = use_dp4a<typename Family::L>(n, K);
    const XOrder order = dp4a ? XOrder::kNatural : Family::kOrder;
    if (a.xfold.kind == Int8XFold::kPlain) {  // x staged in-block (a.xf; dp4a)
    } else if (qx && K <= kQuantizedXMaxK) {  // the norm that wrote x quantized it too
      a.x = Q8K{qx->q[static_cast<int>(order)], qx->d, reinterpret_cast<__half*>(qx->bs)};
      a.xf = nullptr;
    } else if (!dp4a || K > kInBlockMaxK) {  // quantize x once, for every block
      char* base = static_cast<char*>(scratch);
      a.x = Q8K{reinterpret_cast<int8_t*>(base), reinterpret_cast<float*>(base + q_bytes(n, K)),
                reinterpret_cast<__half*>(base + q_bytes(n, K) + d_bytes(n, K))};
      a.xf = nullptr;
      const int64_t blocks = padded_tokens(n) * (K / 256);
      const dim3 grid(static_cast<unsigned>(std::min<int64_t>((blocks + 7) / 8, 1024)));
      err = launch_pdl(quantize_q8k_kernel, grid, dim3(256), 0, stream, static_cast<const float*>(x.data), x.stride, n,
                       K, a.x, order);
      if (err != cudaSuccess) return;
    }
    err = Family::launch(a, up != nullptr, dp4a, stream);
  });
  return err;
}


namespace {

// The launch of int8_matvec_multi_launch (p, its grid, dp4a or not), or false where it is not supported.
bool plan_multi(const WeightView* w, const Mat* y, int parts, Mat x, const QuantizedX* qx, Int8MvParts& p,
                int64_t& grid, bool& dp4a) {
  static const bool on = env_int("HYSPEC_MATMUL_MANY", 1) != 0;
  const int64_t n = x.rows, K = parts > 0 ? w[0].n_in : 0;
  if (!on || parts < 2 || parts > kInt8MvMaxParts || n > 24) return false;
  for (int i = 0; i < parts; ++i)
    if (!int8_matvec_supported(w[i], n) || w[i].n_in != K || (y && y[i].rows != n) ||
        (w[i].type != GgmlType::Q4_K && w[i].type != GgmlType::Q6_K))
      return false;
  dp4a = use_dp4a<Q4KLayout>(n, K) && use_dp4a<Q6KLayout>(n, K);
  const bool norm_rows = qx && K <= kQuantizedXMaxK;
  // Without the norm's copy, the tensor-core kernels (and the dp4a kernels past kInBlockMaxK) need a
  // quantize launch per code order: one matmul each costs the same.
  if (!norm_rows && !(dp4a && K <= kInBlockMaxK)) return false;
  p = Int8MvParts{};
  p.n = parts;
  int64_t tiles[kInt8MvMaxParts], tile_cost[kInt8MvMaxParts], g[kInt8MvMaxParts];
  for (int i = 0; i < parts; ++i) {
    const bool s16 = w[i].type == GgmlType::Q6_K;
    const XOrder order = dp4a ? XOrder::kNatural : s16 ? XOrder::kFragQ6 : XOrder::kFragQ4;
    Int8MvArgs& a = p.a[i];
    a = Int8MvArgs{w[i].data, nullptr, w[i].row_bytes, w[i].n_out, K, Q8K{}, x.data, x.stride, static_cast<int>(n),
                   y ? y[i].data : nullptr, y ? y[i].stride : 0};
    if (norm_rows) {
      a.x = Q8K{qx->q[static_cast<int>(order)], qx->d, reinterpret_cast<__half*>(qx->bs)};
      a.xf = nullptr;
    }
    p.s16[i] = s16;
    tiles[i] = (w[i].n_out + kRows - 1) / kRows;
    // A tile's cost: its bytes. (At 4-16 rows, weighting Q6_K tiles by their tensor-core instructions,
    // ~1.84x a Q4_K tile's against 1.46x its bytes, measured 0.5-1% slower on the 9B in session 26.)
    tile_cost[i] = kRows * static_cast<int64_t>(w[i].row_bytes);
  }
  if (!share_blocks(tiles, tile_cost, parts, 2 * int64_t{sm_count()}, g)) return false;
  grid = 0;
  for (int i = 0; i < parts; ++i) p.first[i] = static_cast<int>(grid), grid += g[i];
  p.first[parts] = static_cast<int>(grid);
  return true;
}

}  // namespace

namespace {
// Whether plan_multi takes these parts at n rows (and then whether on the dp4a kernels).
bool plans_multi(const WeightView* w, int parts, int64_t n, const QuantizedX* qx, bool& dp4a) {
  Int8MvParts p;
  int64_t grid = 0;
  return plan_multi(w, nullptr, parts, Mat{nullptr, n, parts > 0 ? w[0].n_in : 0, 0}, qx, p, grid, dp4a);
}
}  // namespace

bool int8_matvec_multi_supported(const WeightView* w, int parts, int64_t n, const QuantizedX* qx) {
  bool dp4a = false;
  return plans_multi(w, parts, n, qx, dp4a);
}

namespace {
// Whether a multi launch planned on the dp4a kernels or not takes the conv at n rows.
bool conv_fold_plan(int64_t n, bool dp4a) {
  static const bool rows = env_int("HYSPEC_CONV_FOLD_ROWS", 1) != 0;  // 0: one-row launches only (A/B)
  return n == 1 ? dp4a : rows;
}
}  // namespace

bool int8_conv_fold_supported(const WeightView* w, int parts, int64_t n, const QuantizedX* qx) {
  bool dp4a = false;
  return plans_multi(w, parts, n, qx, dp4a) && conv_fold_plan(n, dp4a);
}

bool int8_multi_norm_fold_supported(const WeightView* w, int parts, int64_t n, int64_t K) {
  bool dp4a = false;
  return int8_norm_fold_mode() == 1 && n == 1 && int8_norm_fold_row(K) && parts > 0 && w[0].n_in == K &&
         plans_multi(w, parts, n, nullptr, dp4a) && dp4a;
}

cudaError_t int8_matvec_multi_launch(const WeightView* w, const Mat* y, int parts, Mat x, cudaStream_t stream,
                                     const QuantizedX* qx, const Int8ConvFold* conv, const Int8XFold* xfold) {
  Int8MvParts p;
  int64_t grid = 0;
  bool dp4a = false;
  if (!plan_multi(w, y, parts, x, qx, p, grid, dp4a)) return cudaErrorNotSupported;
  const int64_t n = x.rows;
  auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  if (conv) {
    const bool rows_ok = n == 1 ? !conv->capture
                                : conv->y_stride >= conv->channels && conv->channels % 4 == 0 && aligned(conv->w) &&
                                      aligned(conv->state);  // (conv_prefetch)
    if (!conv_fold_plan(n, dp4a) || conv->channels > w[0].n_out || !rows_ok) return cudaErrorInvalidValue;
    p.a[0].conv_w = conv->w, p.a[0].conv_state = conv->state, p.a[0].conv_y = conv->y;
    p.a[0].conv_channels = conv->channels, p.a[0].conv_capture = conv->capture, p.a[0].conv_y_stride = conv->y_stride;
  }
  if (xfold && xfold->kind != Int8XFold::kNone) {  // the row's norm, in-block (kRmsNorm only)
    if (xfold->kind != Int8XFold::kRmsNorm || qx || !int8_multi_norm_fold_supported(w, parts, n, x.cols) ||
        !aligned(x.data) || !aligned(xfold->y) || !aligned(xfold->norm_w))
      return cudaErrorInvalidValue;
    for (int i = 0; i < parts; ++i) p.a[i].xfold = *xfold, p.a[i].xfold.norm_threads = norm_threads_per_group(x.cols);
    return conv ? launch_multi<1, true, true, kStageNorm>(p, grid, 1, stream)
                : launch_multi<1, true, false, kStageNorm>(p, grid, 1, stream);
  }
  // By width, with or without the conv (several rows: a verify step's GDN in-projection).
  auto by_width = [&](auto with_conv) {
    constexpr bool kConv = decltype(with_conv)::value;
    if (dp4a) return n == 1 ? launch_multi<1, true, kConv>(p, grid, 1, stream) : launch_multi<2, true, kConv>(p, grid, 2, stream);
    if (n <= 8) return launch_multi<1, false, kConv>(p, grid, 8, stream);
    if (n <= 16) return launch_multi<2, false, kConv>(p, grid, 16, stream);
    return launch_multi<3, false, kConv>(p, grid, 24, stream);
  };
  return conv ? by_width(std::true_type{}) : by_width(std::false_type{});
}

namespace {

// Per-slot expert matvecs (int8_experts_launch): blocks [slot * bps, (slot + 1) * bps) serve slot
// `slot` as a one-token int8 matvec launch on expert ids[slot]'s weights would (the dp4a kernel, x
// quantized in-block; WT: on warp tiles), so a slot's row has the same bits whatever the step's width.
// PAIRS: an expert's slots in slot order make pairs (the last alone when odd), which each block finds
// for its slot from the step's ids (a warp's ballots over at most kPairsMaxSlots ids, loaded at once);
// the blocks of both slots of a pair serve the two rows together as the two-token dp4a kernel would,
// reading the expert's weights once, with the one-token bits (the dp4a rows do not depend on the width).
constexpr int kPairsMaxSlots = 256;
struct Int8ExpertArgs {
  Int8MvArgs a;  // expert 0's weights, slot 0's x and y; n = 1
  const int32_t* ids;
  size_t expert_bytes;
  int x_div, blocks_per_slot, n_slots;
};
// kTma: the weights by TMA boxes, from maps of all experts' rows (expert e's first row: e x n_out).
template <class Family, bool SW, bool WT, bool PAIRS, bool kTma>
__device__ __forceinline__ void experts_body(const Int8ExpertArgs& e, uint8_t* smem, const TmaMaps* maps) {
  __shared__ int2 pair;  // PAIRS: the pair's first and second slot (-1: this slot alone)
  const int b = static_cast<int>(blockIdx.x), slot = b / e.blocks_per_slot;
  pdl_wait();  // the router's ids, and x, belong to earlier kernels (no weight is prefetched before)
  Int8MvArgs a = e.a;
  const int expert = e.ids[slot];
  int s0 = slot, s1 = -1;
  BlockSlot bs{b - slot * e.blocks_per_slot, e.blocks_per_slot};
  if constexpr (PAIRS) {
    if (threadIdx.x < 32) {
      constexpr int kPer = kPairsMaxSlots / 32;
      const int lane = threadIdx.x;
      int id[kPer];
#pragma unroll
      for (int k = 0; k < kPer; ++k) id[k] = 32 * k + lane < e.n_slots ? e.ids[32 * k + lane] : -1;
      int rank = 0, prev = -1, next = -1;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int i = 32 * k + lane;
        const unsigned before = __ballot_sync(0xffffffffu, id[k] == expert && i < slot);
        const unsigned after = __ballot_sync(0xffffffffu, id[k] == expert && i > slot);
        rank += __popc(before);
        if (before) prev = 32 * k + 31 - __clz(before);
        if (after && next < 0) next = 32 * k + __ffs(after) - 1;
      }
      if (lane == 0) pair = rank % 2 == 0 ? make_int2(slot, next) : make_int2(prev, slot);
    }
    __syncthreads();
    s0 = pair.x, s1 = pair.y;
    if (s1 >= 0) bs = BlockSlot{bs.idx + (slot == s1) * bs.count, 2 * bs.count};  // both slots' blocks
  }
  const size_t at = static_cast<size_t>(expert) * e.expert_bytes;
  a.w += at;
  if constexpr (SW) a.w2 += at;
  if constexpr (kTma) a.tma_row0 = int64_t{expert} * a.n_out;
  a.xf += static_cast<int64_t>(s0 / e.x_div) * a.xf_stride;
  a.y += static_cast<int64_t>(s0) * a.y_stride;
  if (s1 >= 0) {  // the second row: at a stride from the first (any sign)
    a.xf_stride *= s1 / e.x_div - s0 / e.x_div;
    a.y_stride *= s1 - s0;
    a.n = 2;
  }
  if (PAIRS && s1 >= 0)
    Family::template dp4a_body<2, SW, WT, kTma>(a, smem, bs, maps);
  else  // (a slot alone: the one-token body, lighter than the two-token one at n = 1)
    Family::template dp4a_body<1, SW, WT, kTma>(a, smem, bs, maps);
}
template <class Family, bool SW, bool WT, bool PAIRS>
__global__ void __launch_bounds__(kWarps * 32, 2) experts_kernel(const __grid_constant__ Int8ExpertArgs e) {
  extern __shared__ __align__(16) uint8_t smem[];
  experts_body<Family, SW, WT, PAIRS, false>(e, smem, nullptr);
}
template <class Family, bool SW, bool WT, bool PAIRS>
__global__ void __launch_bounds__(kWarps * 32, 2) experts_tma_kernel(const __grid_constant__ Int8ExpertArgs e,
                                                                     const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(128) uint8_t tma_smem[];  // (the dynamic shared memory, named for its alignment)
  experts_body<Family, SW, WT, PAIRS, true>(e, tma_smem + kTmaBarBytes, &maps);
}

// The expert families with TMA kernels (Q4_K, Q6_K).
template <class Family>
constexpr bool kTmaExperts =
    std::is_same_v<typename Family::L, Q4KLayout> || std::is_same_v<typename Family::L, Q6KLayout>;
// maps: the TMA kernel's (all experts' rows), or null: the cp.async kernel.
template <class Family, bool SW, bool WT, bool PAIRS>
cudaError_t launch_experts(const Int8ExpertArgs& e, int64_t grid, cudaStream_t stream, const TmaMaps* maps) {
  const size_t smem = smem_bytes<typename Family::L>(PAIRS ? 2 : 1, true);
  if constexpr (kTmaExperts<Family>) {
    if (maps) {
      static const cudaError_t attr_err =
          cudaFuncSetAttribute(experts_tma_kernel<Family, SW, WT, PAIRS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem + kTmaBarBytes));
      if (attr_err != cudaSuccess) return attr_err;
      return launch_pdl(experts_tma_kernel<Family, SW, WT, PAIRS>, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32),
                        smem + kTmaBarBytes, stream, e, *maps);
    }
  }
  static const cudaError_t attr_err = cudaFuncSetAttribute(experts_kernel<Family, SW, WT, PAIRS>,
                                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr_err != cudaSuccess) return attr_err;
  return launch_pdl(experts_kernel<Family, SW, WT, PAIRS>, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32), smem,
                    stream, e);
}

// The expert types with a per-slot kernel (the K-quants of MoE files; others take the f16 path).
template <class F>
bool with_expert_family(GgmlType t, F&& f) {
  switch (t) {  // (not with_int8_family: its other families would be compiled for nothing)
    case GgmlType::Q4_K: f(Q4KFamily<false>{}); return true;
    case GgmlType::Q5_K: f(Q4KFamily<true>{}); return true;
    case GgmlType::Q6_K: f(S16Family<Q6KCodes>{}); return true;
    default: return false;
  }
}

}  // namespace

bool int8_experts_supported(const WeightView& w) {
  bool fits = false;
  with_expert_family(w.type, [&](auto family) { fits = dp4a_fits<typename decltype(family)::L>(); });
  return fits && w.int8_matvec && w.n_in % 256 == 0 && staged_x_bytes(1, w.n_in) <= kMaxStagedX;
}

cudaError_t int8_experts_launch(const WeightView& w, const uint8_t* up, int64_t n_experts, const int32_t* expert_ids,
                                int64_t n_slots, int x_div, Mat x, Mat y, cudaStream_t stream, bool pairs) {
  if (n_slots == 0) return cudaSuccess;
  if (!int8_experts_supported(w) || x_div < 1 || n_slots > (int64_t{1} << 20)) return cudaErrorInvalidValue;
  // Rows of fewer than 8 super-blocks (the 512 or 768 inputs of an expert's down projection) would leave
  // warps of a shared tile idle: each warp walks tiles of its own instead. Either way a slot's row has
  // the same bits in every step (the choice depends on the shape only).
  const bool warp_tiles = !up && w.n_in < 256 * kWarps;
  const int64_t out = up ? kRows / 2 : kRows, tiles = (w.n_out + out - 1) / out;
  const int64_t block_tiles = warp_tiles ? (tiles + kWarps - 1) / kWarps : tiles;  // a block's tiles at once
  // The slots share the two blocks per SM: rounded down where that keeps 3/4 of them busy (one wave of
  // blocks: 40 slots take 6 each, 240 blocks, not 7 each in 280, of which 16 wait for a second wave),
  // else rounded (136 slots take 272 blocks, not 136).
  const int64_t cap = 2 * int64_t{sm_count()}, down = cap / n_slots;
  const int64_t bps = std::clamp<int64_t>(down * n_slots * 4 >= cap * 3 ? down : (cap + n_slots / 2) / n_slots, 1,
                                          block_tiles);
  Int8ExpertArgs e{Int8MvArgs{w.data, up, w.row_bytes, w.n_out, w.n_in, Q8K{}, x.data, x.stride, 1, y.data, y.stride},
                   expert_ids, static_cast<size_t>(w.n_out) * w.row_bytes, x_div, static_cast<int>(bps),
                   static_cast<int>(n_slots)};
  pairs = pairs && n_slots <= kPairsMaxSlots && staged_x_bytes(2, w.n_in) <= kMaxStagedX;
  const int64_t grid = n_slots * bps;
  cudaError_t err = cudaErrorInvalidValue;
  with_expert_family(w.type, [&](auto family) {
    using Family = decltype(family);
    // All experts' rows in one map a weight (HYSPEC_TMA_EXPERTS=0: the cp.async kernels; one-token dp4a
    // kernels, so no row pairs).
    TmaMaps maps_of_all;
    Int8MvArgs all = e.a;
    all.n_out = n_experts * w.n_out;
    const TmaMaps* maps = kTmaExperts<Family> && n_experts > 0 && env_int("HYSPEC_TMA_EXPERTS", 1) != 0 &&
                                  use_tma_ring(1, true, w.n_in) &&
                                  tensor_maps<typename Family::L>(all, up != nullptr, true, &maps_of_all)
                              ? &maps_of_all
                              : nullptr;
    if (pairs)
      err = up           ? launch_experts<Family, true, false, true>(e, grid, stream, maps)
            : warp_tiles ? launch_experts<Family, false, true, true>(e, grid, stream, maps)
                         : launch_experts<Family, false, false, true>(e, grid, stream, maps);
    else
      err = up           ? launch_experts<Family, true, false, false>(e, grid, stream, maps)
            : warp_tiles ? launch_experts<Family, false, true, false>(e, grid, stream, maps)
                         : launch_experts<Family, false, false, false>(e, grid, stream, maps);
  });
  return err;
}

}  // namespace hyspec::cuda
