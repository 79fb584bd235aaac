// Decode kernels for an x86 CPU with AVX2 or AVX-512 (see engine/kernels.py): matrix products for a
// few rows with fp32 weights and for any number with int8 ones, attention for one new token per
// sequence, the layer norm, GELU and a greedy pick's argmax, and a decode step's blocks for one new
// token per sequence in one call.
//
// A decode step multiplies a few rows (one token per sequence) by every weight matrix, so its
// speed is how fast the weights stream from memory. Each output channel is one dot product of a
// contiguous weight row with each input row, and several input rows share one pass over the
// weight row (struct Pass). Every input row is summed in the same order whatever the number of rows, so a
// sequence gets bit-identical results alone or in a batch.
//
// int8 weights are multiplied in integers. A call first rounds its input rows to 8 bits, one
// scale per group of 64 values (struct Activations); then one instruction multiplies 4 input
// bytes by 4 weight bytes of each of 16 (or 8) output channels and adds them into the channels'
// 32-bit sums, exactly (the weights are packed for it, see kBlock), and each group's sums are
// scaled into float sums once. Converting each weight to float instead costs more arithmetic
// than the memory takes to deliver the weights. The instruction is the best
// the CPU has (kernels.py picks it at run time and builds only that one, see INT8_DOT there):
// AVX512-VNNI's vpdpbusd on 64 bytes, AVX-VNNI's on 32, or AVX2's vpmaddubsw and vpmaddwd; with
// AMX, calls of more rows multiply 16 rows by 16 channels in one tile instruction (amx_blocks).
//
// Only the headers the code uses: torch/extension.h takes 16 of a build's 21 seconds to read.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>
#ifdef __AMX_INT8__
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

using at::Tensor;
using MaybeTensor = std::optional<Tensor>;

// How the products are blocked, by weight type and vector width.
// - `rows`: a call with up to this many rows (a decode batch) takes `weights` weight rows at a
//   time and runs all its rows over them, so each weight is read once per call. Memory sets the
//   speed there, and few streams of weights read fastest.
// - `block_weights` x `block_rows`: a call with more rows (a prompt, a batch past `rows`)
//   takes blocks of that many weight rows and input rows. Arithmetic sets the speed there, so
//   each weight vector loaded serves several input rows and each input vector several weight
//   rows; the block's sums fill most of the vector registers (16 with AVX2, 32 with AVX-512).
//   The shapes are the fastest of those tried on each width.
template <typename Weight> struct Pass;
#ifdef __AVX512F__
template <> struct Pass<float> {
  static constexpr int rows = 8, weights = 2, block_weights = 4, block_rows = 6;
};
#else
template <> struct Pass<float> {
  static constexpr int rows = 4, weights = 1, block_weights = 3, block_rows = 4;
};
#endif
// int8 weights go in blocks of 16 channels (kBlock), so `weights` and `block_weights` count blocks
// there; their sums take twice the registers with AVX2's vectors.
#ifdef __AVX512VNNI__
template <> struct Pass<int8_t> {
  static constexpr int rows = 4, weights = 2, block_weights = 2, block_rows = 6;
};
#else
template <> struct Pass<int8_t> {
  static constexpr int rows = 2, weights = 1, block_weights = 1, block_rows = 2;
};
#endif

// How far ahead of the weight rows in use to prefetch: the hardware prefetcher alone leaves gaps
// once a pass does more than stream. At least kPrefetchRows rows, and at least kPrefetchBytes, so
// that short rows (the bundled model's 1 KB) are asked for as early as long ones.
constexpr int kPrefetchRows = 4;
constexpr int64_t kPrefetchBytes = 12 * 1024;

template <typename Weight>
inline int64_t prefetch_rows(int64_t in) {
  return std::max<int64_t>(kPrefetchRows, kPrefetchBytes / (in * static_cast<int64_t>(sizeof(Weight))));
}

// Ask for the line `rows_ahead` rows past each of the WR weight rows at w (row length `in`).
template <int WR, typename Weight>
inline void prefetch_ahead(const Weight* w, int64_t in) {
  const char* ahead = reinterpret_cast<const char*>(w + prefetch_rows<Weight>(in) * in);
  for (int j = 0; j < WR; j++) _mm_prefetch(ahead + j * in * sizeof(Weight), _MM_HINT_T0);
}

// The float vectors the products work in: AVX-512's 16 floats where the build targets it
// (kernels.py asks for that on a CPU that has it), AVX2's 8 otherwise. The attention keeps
// AVX2's 8: a head is 64 wide, and its time is not in the arithmetic.
#ifdef __AVX512F__
using Floats = __m512;
constexpr int kLanes = 16;
inline Floats zeros() { return _mm512_setzero_ps(); }
inline Floats fmadd(Floats a, Floats b, Floats c) { return _mm512_fmadd_ps(a, b, c); }
inline Floats load_floats(const float* w) { return _mm512_loadu_ps(w); }
#else
using Floats = __m256;
constexpr int kLanes = 8;
inline Floats zeros() { return _mm256_setzero_ps(); }
inline Floats fmadd(Floats a, Floats b, Floats c) { return _mm256_fmadd_ps(a, b, c); }
inline Floats load_floats(const float* w) { return _mm256_loadu_ps(w); }
#endif

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#ifdef __AVX512F__
inline float horizontal_sum(__m512 v) {
  return horizontal_sum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#endif

// Where a block's sums go: y[r, o] = sum * scale[o] + bias[o]; scale and bias may be null.
struct Output {
  float* y;
  int64_t out_features;
  const float *scale, *bias;
  void put(int64_t r, int64_t o, float sum) const {
    const float v = scale ? sum * scale[o] : sum;
    y[r * out_features + o] = bias ? v + bias[o] : v;
  }
};

// The input rows of an fp32 product, as they are.
struct FloatRows {
  const float* x;
  int64_t in;
  const float* row(int64_t r) const { return x + r * in; }
};

// y[r + k, o + j] for WR weight rows from w (output channels o...) and N input rows of x (rows
// r...), each `in` long: one dot product each, the tail past the last full vector added last.
// Every dot product takes the same additions in the same order whatever WR and N are, so a
// row's result does not depend on the call's other rows.
template <int WR, int N>
inline void dot_block(const float* w, const FloatRows& x, int64_t o, int64_t r, const Output& out) {
  const int64_t in = x.in;
  Floats acc[WR][N];
  for (int j = 0; j < WR; j++)
    for (int k = 0; k < N; k++) acc[j][k] = zeros();
  int64_t i = 0;
  for (; i + kLanes <= in; i += kLanes) {
    if ((i * sizeof(float)) % 64 == 0) prefetch_ahead<WR>(w + i, in);  // once per line
    Floats wv[WR];
    for (int j = 0; j < WR; j++) wv[j] = load_floats(w + j * in + i);
    for (int k = 0; k < N; k++) {
      const Floats xv = load_floats(x.row(r + k) + i);
      for (int j = 0; j < WR; j++) acc[j][k] = fmadd(wv[j], xv, acc[j][k]);
    }
  }
  for (int j = 0; j < WR; j++)
    for (int k = 0; k < N; k++) {
      float s = horizontal_sum(acc[j][k]);
      for (int64_t t = i; t < in; t++) s += w[j * in + t] * x.row(r + k)[t];
      out.put(r + k, o + j, s);
    }
}

// ---- int8 weights: integer dot products ----

constexpr int kGroup = 64;  // input values sharing one 8-bit scale (quantize.py's GROUP)
constexpr int kBlock = 16;  // output channels per block of a packed weight (quantize.py's BLOCK)

// int8 weights come packed (quantize.py's `pack`): in blocks of 16 output channels, and within a
// block, for every 4 inputs, the 16 channels' 4 bytes one after the other. Those 64 bytes are what
// one vpdpbusd takes: it multiplies each channel's 4 bytes by the same 4 input bytes (broadcast)
// and adds the 4 products into that channel's 32-bit lane. A block's 16 sums so stay in one
// register, and a group of 64 inputs costs 16 of these and one conversion to float for 16
// channels; along a weight row's own bytes it cost one each per channel, which kept the decode
// step bound by arithmetic rather than by memory. The bytes are stored plus 128 (top bit flipped),
// unsigned as vpdpbusd takes its first operand; the channels past the last whole block follow
// row by row. Packed only where `in` is a multiple of kGroup (every GPT-2), so a group is whole.
//
// One path of the three (the file's head): `Ints` holds integer sums for kBlock / kParts
// channels, `load_part` loads a part of the 64 bytes and `dot4` adds the 4-byte products of each
// lane's weights with the broadcast input bytes x4 into its sums, exactly.
#if defined(__AVX512VNNI__)
#ifdef __AMX_INT8__
constexpr const char* kInt8Dot = "AMX";  // calls of more than 4 rows; fewer take AVX512-VNNI (amx_blocks)
#else
constexpr const char* kInt8Dot = "AVX512-VNNI";
#endif
using Ints = __m512i;
using GroupFloats = __m512;
constexpr int kParts = 1;
inline Ints int_zeros() { return _mm512_setzero_si512(); }
inline Ints load_part(const int8_t* w) { return _mm512_loadu_si512(w); }
inline Ints broadcast4(const int8_t* x) { int32_t v; std::memcpy(&v, x, 4); return _mm512_set1_epi32(v); }
inline Ints dot4(Ints sums, Ints w, Ints x4) { return _mm512_dpbusd_epi32(sums, w, x4); }
inline GroupFloats group_zeros() { return _mm512_setzero_ps(); }
inline GroupFloats scaled_add(Ints sums, float scale, GroupFloats acc) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(scale), acc);
}
inline void store_floats(float* f, GroupFloats v) { _mm512_storeu_ps(f, v); }
constexpr bool kUnsignedWeights = true;
#else
using Ints = __m256i;
using GroupFloats = __m256;
constexpr int kParts = 2;
inline Ints int_zeros() { return _mm256_setzero_si256(); }
inline Ints load_part(const int8_t* w) { return _mm256_loadu_si256(reinterpret_cast<const Ints*>(w)); }
inline Ints broadcast4(const int8_t* x) { int32_t v; std::memcpy(&v, x, 4); return _mm256_set1_epi32(v); }
#if defined(__AVXVNNI__)
constexpr const char* kInt8Dot = "AVX-VNNI";
inline Ints dot4(Ints sums, Ints w, Ints x4) { return _mm256_dpbusd_avx_epi32(sums, w, x4); }
constexpr bool kUnsignedWeights = true;
#else
constexpr const char* kInt8Dot = "AVX2";
// vpmaddubsw multiplies unsigned bytes by signed ones and adds pairs into 16 bits, saturating.
// |x| (at most 127) times w with x's sign (at most 127) keeps each pair within 2 * 127 * 127,
// short of the saturation; vpmaddwd then adds pairs of those into 32 bits. The weights are made
// signed again first, so there is no offset to take off.
inline Ints dot4(Ints sums, Ints w, Ints x4) {
  const Ints signed_w = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
  const Ints pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(x4), _mm256_sign_epi8(signed_w, x4));
  return _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
constexpr bool kUnsignedWeights = false;
#endif
inline GroupFloats group_zeros() { return _mm256_setzero_ps(); }
inline GroupFloats scaled_add(Ints sums, float scale, GroupFloats acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(scale), acc);
}
inline void store_floats(float* f, GroupFloats v) { _mm256_storeu_ps(f, v); }
#endif

constexpr int kPartBytes = 4 * kBlock / kParts, kPartChannels = kBlock / kParts;

// The input rows of an int8 product, rounded to 8 bits. In each group of kGroup values of a row
// (`in` is a multiple of kGroup), scale = max|x| / 127 and q = round(x / scale), half to even
// (quantize.py's rows_in_8_bits, in the same float operations, so q is the same), and x is about
// q * scale; a group whose scale would be below the smallest normal float is all 0. A row holding
// a NaN or an infinity has `poison` NaN, so its results are NaN as in PyTorch. Made once per call,
// before the threads split the output channels.
struct Activations {
  int64_t in, groups;
  std::vector<int8_t> values;  // rows x in
  std::vector<float> scales;   // rows x groups
  std::vector<float> poison;   // per row: 0, or NaN
  // (unsigned weights) per row: what the weights' +128 adds to each of dot_block's float sums,
  // 128 * each group's input bytes times its scale, added up in the same operations. (Inputs past
  // about 1e36 then overflow both to inf, and give NaN.)
  std::vector<float> offsets;

  const int8_t* group(int64_t r, int64_t g) const { return values.data() + (r * groups + g) * kGroup; }
  float scale(int64_t r, int64_t g) const { return scales[r * groups + g]; }
};

inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// In AVX2's vectors of 8, the same operations as one value at a time: 8 to 16 times faster, and a
// decode step rounds some 40,000 values.
// `padded_rows` (at least rows) of 8-bit values, the rows past `rows` 0: whole tiles for AMX.
Activations in_8_bits(const float* x, int64_t rows, int64_t in, int64_t padded_rows) {
  Activations a{in, in / kGroup};
  a.values.assign(padded_rows * in, 0);
  a.scales.assign(rows * a.groups, 0.0f);
  a.poison.assign(rows, 0.0f);
  a.offsets.assign(rows, 0.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // A prompt's rows split between the threads; a decode step's few stay on this one.
  at::parallel_for(0, rows, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; r++)
      for (int64_t g = 0; g < a.groups; g++) {
        const float* values = x + r * in + g * kGroup;
        __m256 top = _mm256_setzero_ps(), times_zero = _mm256_setzero_ps();  // NaN where a value is not finite
        for (int i = 0; i < kGroup; i += 8) {
          const __m256 v = _mm256_loadu_ps(values + i);
          top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v));
          times_zero = _mm256_fmadd_ps(v, _mm256_setzero_ps(), times_zero);
        }
        if (std::isnan(horizontal_sum(times_zero))) {
          a.poison[r] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        const float scale = horizontal_max(top) / 127.0f;
        if (scale < std::numeric_limits<float>::min()) continue;  // subnormal: x / scale could pass 127; all 0
        a.scales[r * a.groups + g] = scale;
        int8_t* q = a.values.data() + (r * a.groups + g) * kGroup;
        alignas(32) int32_t steps[kGroup];
        for (int i = 0; i < kGroup; i += 8)  // round half to even, as the CPU rounds by default
          _mm256_store_si256(reinterpret_cast<__m256i*>(steps + i),
                             _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(values + i), _mm256_set1_ps(scale))));
        int32_t total = 0;
        for (int i = 0; i < kGroup; i++) total += q[i] = static_cast<int8_t>(steps[i]);
        if constexpr (kUnsignedWeights) a.offsets[r] = std::fma(static_cast<float>(128 * total), scale, a.offsets[r]);
      }
  });
  return a;
}

// dot_block for packed int8 weights: WB blocks of kBlock channels from w (channels o...) and N
// input rows of x (rows r...). Each group's exact integer sums are scaled by the input's group
// scale into a float sum, which ends less the row's offset.
template <int WB, int N>
inline void dot_block(const int8_t* w, const Activations& x, int64_t o, int64_t r, const Output& out) {
  const int64_t block_bytes = x.in * kBlock;
  GroupFloats acc[WB][kParts][N];
  for (auto& block : acc)
    for (auto& part : block)
      for (auto& a : part) a = group_zeros();
  for (int64_t g = 0; g < x.groups; g++) {
    Ints sums[WB][kParts][N];
    for (auto& block : sums)
      for (auto& part : block)
        for (auto& s : part) s = int_zeros();
    for (int c = 0; c < kGroup; c += 4) {
      const int8_t* at = w + (g * kGroup + c) * kBlock;  // the 64 bytes of inputs c..c + 3
      Ints wv[WB][kParts];
      for (int j = 0; j < WB; j++) {
        _mm_prefetch(reinterpret_cast<const char*>(at + j * block_bytes + kPrefetchBytes), _MM_HINT_T0);
        for (int p = 0; p < kParts; p++) wv[j][p] = load_part(at + j * block_bytes + p * kPartBytes);
      }
      for (int k = 0; k < N; k++) {
        const Ints x4 = broadcast4(x.group(r + k, g) + c);
        for (int j = 0; j < WB; j++)
          for (int p = 0; p < kParts; p++) sums[j][p][k] = dot4(sums[j][p][k], wv[j][p], x4);
      }
    }
    for (int k = 0; k < N; k++) {
      const float scale = x.scale(r + k, g);
      for (int j = 0; j < WB; j++)
        for (int p = 0; p < kParts; p++) acc[j][p][k] = scaled_add(sums[j][p][k], scale, acc[j][p][k]);
    }
  }
  for (int j = 0; j < WB; j++)
    for (int k = 0; k < N; k++) {
      float sums[kBlock];
      for (int p = 0; p < kParts; p++) store_floats(sums + p * kPartChannels, acc[j][p][k]);
      for (int l = 0; l < kBlock; l++) out.put(r + k, o + j * kBlock + l, sums[l] - x.offsets[r + k] + x.poison[r + k]);
    }
}

#ifdef __AMX_INT8__
// AMX: one instruction (tdpbsud) multiplies a tile of 16 rows x 64 signed input bytes by a tile
// of 16 x 64 unsigned weight bytes laid out as a packed block's group is (for every 4 inputs, the
// 16 channels' 4 bytes: the order AMX takes its second tile in), into 16 x 16 exact 32-bit sums,
// 16 times the products of a vpdpbusd. Those sums are the ones dot_block gets, and they are scaled
// and added in the same operations, so a row gets the same bits either way. For calls of more
// than Pass<int8_t>::rows rows (prompts, large batches), where arithmetic sets the speed; a decode
// step's few rows would waste most of a tile, and stay on vpdpbusd.
constexpr int kTileRows = 16;

// Linux gives a process the tiles' state only once it asks for it (arch_prctl).
bool amx_allowed() {
  static const bool allowed = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return allowed;
}

struct TileConfig {  // ldtilecfg's 64 bytes: tiles 0 (sums), 1 (inputs), 2 (weights), 16 rows x 64 bytes
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64};
  uint8_t rows[16] = {16, 16, 16};
};

// Whether a call of `rows` rows multiplies on the tiles: x must then be padded to whole tiles.
bool on_tiles(int64_t rows) { return rows > Pass<int8_t>::rows && amx_allowed(); }

// Blocks [begin, end) over every row, 16 rows at a time (x padded to whole tiles).
void amx_blocks(const int8_t* w, const Activations& x, int64_t rows, int64_t begin, int64_t end, const Output& out) {
  const TileConfig config;
  _tile_loadconfig(&config);  // per thread
  alignas(64) int32_t tile_sums[kTileRows][kBlock];
  for (int64_t b = begin; b < end; b++) {
    const int8_t* block = w + b * kBlock * x.in;
    for (int64_t r = 0; r < rows; r += kTileRows) {
      const int n = static_cast<int>(std::min<int64_t>(kTileRows, rows - r));
      GroupFloats acc[kTileRows];
      for (auto& a : acc) a = group_zeros();
      for (int64_t g = 0; g < x.groups; g++) {
        _tile_zero(0);
        _tile_loadd(1, x.group(r, g), x.in);
        _tile_loadd(2, block + g * kGroup * kBlock, 4 * kBlock);
        _tile_dpbsud(0, 1, 2);
        _tile_stored(0, tile_sums, 4 * kBlock);
        for (int k = 0; k < n; k++)
          acc[k] = scaled_add(_mm512_load_si512(tile_sums[k]), x.scale(r + k, g), acc[k]);
      }
      for (int k = 0; k < n; k++) {
        float sums[kBlock];
        store_floats(sums, acc[k]);
        for (int l = 0; l < kBlock; l++) out.put(r + k, b * kBlock + l, sums[l] - x.offsets[r + k] + x.poison[r + k]);
      }
    }
  }
  _tile_release();
}
#endif

// The channels [first, out) past the last whole block, stored row by row after the blocks: the
// same sums one value at a time (fewer than 16 channels, in the output head alone).
void tail_channels(const int8_t* w, const Activations& x, int64_t rows, int64_t first, const Output& out) {
  for (int64_t o = first; o < out.out_features; o++, w += x.in)
    for (int64_t r = 0; r < rows; r++) {
      float sum = 0.0f;
      for (int64_t g = 0; g < x.groups; g++) {
        int32_t total = 0;
        for (int i = 0; i < kGroup; i++)
          total += static_cast<int8_t>(w[g * kGroup + i] ^ 0x80) * x.group(r, g)[i];
        sum = std::fma(static_cast<float>(total), x.scale(r, g), sum);
      }
      out.put(r, o, sum + x.poison[r]);
    }
}

// dot_block for wr <= WR weight units and n <= N input rows, with both known at compile time.
template <int WR, int N, typename Weight, typename Rows>
inline void dot_block_upto(int64_t wr, int64_t n, const Weight* w, const Rows& x, int64_t o, int64_t r,
                           const Output& out) {
  if constexpr (WR > 1) {
    if (wr < WR) return dot_block_upto<WR - 1, N>(wr, n, w, x, o, r, out);
  }
  if constexpr (N > 1) {
    if (n < N) return dot_block_upto<WR, N - 1>(wr, n, w, x, o, r, out);
  }
  dot_block<WR, N>(w, x, o, r, out);
}

// The output channels of one unit of a pass's weights: an fp32 weight row, or a packed int8 block.
template <typename Weight> constexpr int64_t kChannels = 1;
template <> constexpr int64_t kChannels<int8_t> = kBlock;

// Blocks of WR weight units x N input rows over units [begin, end) and every row.
template <int WR, int N, typename Weight, typename Rows>
void blocks(const Weight* w, const Rows& x, int64_t rows, int64_t begin, int64_t end, const Output& out) {
  for (int64_t u = begin; u < end; u += WR)
    for (int64_t r = 0; r < rows; r += N) {
      const int64_t o = u * kChannels<Weight>;
      dot_block_upto<WR, N>(std::min<int64_t>(WR, end - u), std::min<int64_t>(N, rows - r), w + o * x.in, x, o, r,
                            out);
    }
}

// y = x @ w.T * scale + bias over `rows` input rows, into out; on AMX's tiles where `tiles` (x
// padded to whole tiles, on_tiles).
template <typename Weight, typename Rows>
void rows_times_weight(const Rows& x, int64_t rows, const Weight* w, int64_t out_features, const Output& out,
                       bool tiles = false) {
  using P = Pass<Weight>;
  const int64_t units = out_features / kChannels<Weight>;
  at::parallel_for(0, units, 64 / kChannels<Weight>, [&](int64_t begin, int64_t end) {
#ifdef __AMX_INT8__
    if constexpr (std::is_same_v<Weight, int8_t>)
      if (tiles) return amx_blocks(w, x, rows, begin, end, out);
#endif
    if (rows <= P::rows)
      blocks<P::weights, P::rows>(w, x, rows, begin, end, out);
    else
      blocks<P::block_weights, P::block_rows>(w, x, rows, begin, end, out);
  });
  if constexpr (kChannels<Weight> > 1) tail_channels(w + units * kChannels<Weight> * x.in, x, rows, units * kChannels<Weight>, out);
}

bool is_cpu_float(const Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

bool is_float_vector(const MaybeTensor& t, int64_t size) {
  return t && is_cpu_float(*t) && t->dim() == 1 && t->size(0) == size && t->is_contiguous();
}

// Whether the products can take this weight (int8 with a scale, packed: uint8, `in` a multiple of
// kGroup; or fp32), bias and scale.
bool takes_weight(const Tensor& weight, const MaybeTensor& bias, const MaybeTensor& scale) {
  if (weight.dim() != 2 || !weight.device().is_cpu() || !weight.is_contiguous() || weight.size(1) == 0
      || weight.scalar_type() != (scale ? at::kByte : at::kFloat) || (scale && weight.size(1) % kGroup != 0))
    return false;
  for (const auto* extra : {&bias, &scale})
    if (extra->has_value() && !is_float_vector(*extra, weight.size(0))) return false;
  return true;
}

// y (rows, out) = x (rows, in) @ weight.T (* scale) + bias, for a weight takes_weight took.
void product(const float* x, int64_t rows, const Tensor& weight, const MaybeTensor& bias, const MaybeTensor& scale,
             float* y) {
  const int64_t in = weight.size(1);
  const Output out{y, weight.size(0), scale ? scale->data_ptr<float>() : nullptr, bias ? bias->data_ptr<float>() : nullptr};
  if (!scale) return rows_times_weight(FloatRows{x, in}, rows, weight.data_ptr<float>(), out.out_features, out);
#ifdef __AMX_INT8__
  const bool tiles = on_tiles(rows);
#else
  const bool tiles = false;
#endif
  const auto* packed = reinterpret_cast<const int8_t*>(weight.data_ptr<uint8_t>());  // its bytes as they are
  rows_times_weight(in_8_bits(x, rows, in, tiles ? (rows + 15) / 16 * 16 : rows), rows, packed, out.out_features, out,
                    tiles);
}

// x @ weight.T (* scale) + bias over x's last dimension, or None where the kernels cannot take
// the call: another device, dtype or memory order, or mismatched shapes (left to PyTorch, which
// names them). kernels.py has already decided the call is theirs to take (few rows, no autograd).
// Checked here rather than in Python: a decode step makes about fifty of these calls.
MaybeTensor linear(const Tensor& input, const Tensor& weight, const MaybeTensor& bias, const MaybeTensor& scale) {
  if (input.dim() < 1 || !is_cpu_float(input) || !takes_weight(weight, bias, scale)) return std::nullopt;
  if (input.size(-1) != weight.size(1) || input.numel() == 0) return std::nullopt;
  const Tensor x = input.reshape({-1, weight.size(1)}).contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  shape.back() = weight.size(0);
  Tensor y = at::empty(shape, input.options());
  product(x.data_ptr<float>(), x.size(0), weight, bias, scale, y.data_ptr<float>());
  return y;
}

// exp(x) for x <= 0 (softmax after subtracting the maximum): exp(x) = 2^n exp(r) with
// n = round(x / ln 2) and |r| <= ln 2 / 2, exp(r) by its Taylor polynomial (Cephes' expf), to
// about 2 ulp down to x = -87; below that it gives exp(-87), 1.6e-38, next to the top score's 1.
// Vectorised: a scalar exponential per score would cost as much as the rest of the attention.
// NaN stays NaN.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);  // below, 2^n is no longer a normal float; NaN passes
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts, so r stays exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_to_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
}

// Slots rounded up to whole vectors of 8 scores: the length of attend's score buffer.
inline int64_t padded_slots(int64_t slots) { return (slots + 7) / 8 * 8; }

inline float dot(const float* a, const float* b, int64_t n) {  // n a multiple of 8
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  return horizontal_sum(acc);
}

// The horizontal sums of eight vectors at once: lane j of the result is horizontal_sum(v[j]), in
// the same additions in the same order (the lower half plus the upper, then lanes 0 + 2 and 1 + 3,
// then 0 + 1), so a score comes out in the same bits as from dot(), in 22 instructions where
// eight horizontal_sum calls take 56.
inline __m256 horizontal_sums(const __m256 (&v)[8]) {
  __m256 halves[4];  // halves[i]: (lanes 0-3 of v[2i] + lanes 4-7 of v[2i], the same of v[2i + 1])
  for (int i = 0; i < 4; i++)
    halves[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                              _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  __m256 pairs[2];  // pairs[i]: lanes (0 + 2, 1 + 3) of v[4i], v[4i + 2] | of v[4i + 1], v[4i + 3]
  for (int i = 0; i < 2; i++)
    pairs[i] = _mm256_add_ps(_mm256_shuffle_ps(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm256_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // (0 2 4 6 | 1 3 5 7) in order
}

// dot(q, k + j * slot_stride, dim) for the eight slots j = 0..7, in its bits (see horizontal_sums).
inline __m256 dots8(const float* q, const float* k, int64_t slot_stride, int64_t dim) {
  __m256 acc[8];
  for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + j * slot_stride + i), acc[j]);
  }
  return horizontal_sums(acc);
}

// out[0, 8N) = norm * sum_s p[s] v[s][0, 8N) over the slots, one slot after another, skipping
// masked ones (p = 0): attend's weighted sum of the values, 8N of their dim entries at a time. The
// sums stay in registers through the slots, so no slot's multiply-adds wait for the previous
// slot's stores.
template <int N>
inline void weighted_sum(const float* p, const float* v, int64_t slot_stride, int64_t slots, __m256 norm, float* out) {
  __m256 sums[N];
  for (int j = 0; j < N; j++) sums[j] = _mm256_setzero_ps();
  for (int64_t s = 0; s < slots; s++) {
    if (p[s] == 0.0f) continue;  // masked
    const __m256 weight = _mm256_set1_ps(p[s]);
    for (int j = 0; j < N; j++) sums[j] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(v + s * slot_stride + 8 * j), sums[j]);
  }
  for (int j = 0; j < N; j++) _mm256_storeu_ps(out + 8 * j, _mm256_mul_ps(sums[j], norm));
}

// weighted_sum for n <= N vectors, with n known at compile time (as dot_block_upto).
template <int N>
inline void weighted_sum_upto(int64_t n, const float* p, const float* v, int64_t slot_stride, int64_t slots,
                              __m256 norm, float* out) {
  if constexpr (N > 1) {
    if (n < N) return weighted_sum_upto<N - 1>(n, p, v, slot_stride, slots, norm, out);
  }
  weighted_sum<N>(p, v, slot_stride, slots, norm, out);
}

// scores[s] = q.k[s] / sqrt(dim) for the slots `seen` marks (all when null), -inf for the others
// and up to padded_slots(slots): eight slots at a time (dots8), then one by one, in the same bits
// either way; eight at a time shares each query load and one tree of horizontal sums.
void score_slots(const float* q, const float* k, int64_t slot_stride, int64_t slots, int64_t dim, const bool* seen,
                 float* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const float minus_inf = -std::numeric_limits<float>::infinity();
  int64_t s = 0;
  for (; s + 8 <= slots; s += 8) {
    _mm256_storeu_ps(scores + s, _mm256_mul_ps(dots8(q, k + s * slot_stride, slot_stride, dim), _mm256_set1_ps(scale)));
    if (seen)
      for (int j = 0; j < 8; j++)
        if (!seen[s + j]) scores[s + j] = minus_inf;
  }
  for (; s < padded_slots(slots); s++)
    scores[s] = s < slots && (!seen || seen[s]) ? dot(q, k + s * slot_stride, dim) * scale : minus_inf;
}

// Softmax attention of one query over the slots of one (row, head): out = sum_s p[s] v[s] / sum_s p[s],
// p[s] = exp(q.k[s] / sqrt(dim) - max) over the slots `seen` marks (all when null; the caller
// lets every query see at least its own slot). `scores` has room for padded_slots(slots).
// Slot s always falls in lane s % 8 and masked slots add exact zeros, so a row's result does not
// depend on how many slots other rows have, as long as its tokens keep their slot numbers (the
// scheduler's rows do: each prompt is prefilled alone from slot 0 and copied slot for slot). A NaN
// or infinite score makes the result NaN, as in PyTorch.
void attend(const float* q, const float* k, const float* v, int64_t slot_stride, int64_t slots, int64_t dim,
            const bool* seen, float* scores, float* out) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const int64_t padded = padded_slots(slots);
  score_slots(q, k, slot_stride, slots, dim, seen, scores);
  float top = minus_inf;
  for (int64_t s = 0; s < padded; s++) top = std::max(top, scores[s]);  // a NaN score is skipped here, and turns p NaN below
  __m256 total = _mm256_setzero_ps();
  for (int64_t s = 0; s < padded; s += 8) {
    const __m256 x = _mm256_loadu_ps(scores + s);
    const __m256 p = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(x, _mm256_set1_ps(top))),
                                   _mm256_cmp_ps(x, _mm256_set1_ps(minus_inf), _CMP_NEQ_UQ));  // masked: 0
    _mm256_storeu_ps(scores + s, p);
    total = _mm256_add_ps(total, p);
  }
  const __m256 norm = _mm256_set1_ps(1.0f / horizontal_sum(total));
  for (int64_t d = 0; d < dim; d += 64)  // dim a multiple of 8; up to 8 vectors of it at a time
    weighted_sum_upto<8>(std::min<int64_t>(dim - d, 64) / 8, scores, v + d, slot_stride, slots, norm, out + d);
}

// Where attend_rows finds each (row, head)'s query, keys, values and mask row: keys and values
// share their strides (a KV cache's layer, or a projection's output split into heads).
struct Heads {
  const float *q, *k, *v;
  int64_t q_row, q_head, kv_row, kv_head, slot_stride;
  const bool* seen;  // (rows, slots) with row stride seen_row, or null
  int64_t seen_row;
  float* out;  // (rows, heads, dim)
};

// attend for every (row, head), the pairs split among the threads.
void attend_rows(const Heads& a, int64_t rows, int64_t heads, int64_t slots, int64_t dim) {
  const int64_t work = std::max<int64_t>(1, 16384 / (slots * dim));  // (row, head) pairs per thread at least
  at::parallel_for(0, rows * heads, work, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(padded_slots(slots));
    for (int64_t i = begin; i < end; i++) {
      const int64_t r = i / heads, h = i % heads;
      attend(a.q + r * a.q_row + h * a.q_head, a.k + r * a.kv_row + h * a.kv_head, a.v + r * a.kv_row + h * a.kv_head,
             a.slot_stride, slots, dim, a.seen ? a.seen + r * a.seen_row : nullptr, scores.data(),
             a.out + (r * heads + h) * dim);
    }
  });
}

// Whether decode_attention can take this mask for rows x slots (no mask: yes).
bool takes_mask(const MaybeTensor& seen, int64_t rows, int64_t slots) {
  return !seen || (seen->scalar_type() == at::kBool && seen->dim() == 2 && seen->size(0) == rows
                   && seen->size(1) == slots && seen->stride(1) == 1 && seen->device().is_cpu());
}

// Whether decode_attention can take q, keys, values and seen (below).
bool takes_attention(const Tensor& q, const Tensor& keys, const Tensor& values,
                     const MaybeTensor& seen) {
  for (const auto* t : {&q, &keys, &values})
    if (t->dim() != 4 || !is_cpu_float(*t) || t->stride(3) != 1) return false;
  const int64_t rows = q.size(0), heads = q.size(1), slots = keys.size(2), dim = q.size(3);
  return q.size(2) == 1 && dim != 0 && dim % 8 == 0 && slots != 0 && keys.sizes() == values.sizes()
         && keys.strides() == values.strides() && keys.size(0) == rows && keys.size(1) == heads && keys.size(3) == dim
         && takes_mask(seen, rows, slots);
}

// Attention of one new token per row: q (rows, heads, 1, dim), keys and values (rows, heads,
// slots, dim) as views of the KV cache, `seen` an optional (rows, slots) mask (the query's own
// row of the causal-padding mask). Returns (rows, heads, 1, dim) as a view of (rows, 1, heads,
// dim), so the caller's merge of the heads is free. None where the kernel cannot take the call.
MaybeTensor decode_attention(const Tensor& q, const Tensor& keys,
                                              const Tensor& values, const MaybeTensor& seen) {
  if (!takes_attention(q, keys, values, seen)) return std::nullopt;
  const int64_t heads = q.size(1);
  Tensor y = at::empty({q.size(0), 1, heads, q.size(3)}, q.options());
  attend_rows({q.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(), q.stride(0), q.stride(1),
               keys.stride(0), keys.stride(1), keys.stride(2), seen ? seen->data_ptr<bool>() : nullptr,
               seen ? seen->stride(0) : 0, y.data_ptr<float>()},
              q.size(0), heads, keys.size(2), q.size(3));
  return y.transpose(1, 2);
}

// ---- the rest of a block, and a whole block in one call ----

// Layer normalization of `rows` rows of `width` values: (x - mean) / sqrt(variance + eps) * w + b,
// the mean and the variance summed 8 lanes at a time and the lanes in one order, so a row's
// result is its own whatever the other rows.
void layer_norm_rows(const float* x, int64_t rows, int64_t width, const float* w, const float* b, float eps, float* y) {
  for (int64_t r = 0; r < rows; r++, x += width, y += width) {
    __m256 sums = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) sums = _mm256_add_ps(sums, _mm256_loadu_ps(x + i));
    float sum = horizontal_sum(sums);
    for (int64_t t = i; t < width; t++) sum += x[t];
    const float mean = sum / static_cast<float>(width);
    __m256 squares = _mm256_setzero_ps();
    for (i = 0; i + 8 <= width; i += 8) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(mean));
      squares = _mm256_fmadd_ps(d, d, squares);
    }
    float square = horizontal_sum(squares);
    for (int64_t t = i; t < width; t++) square += (x[t] - mean) * (x[t] - mean);
    const float inverse = 1.0f / std::sqrt(square / static_cast<float>(width) + eps);
    for (int64_t t = 0; t < width; t++) y[t] = (x[t] - mean) * inverse * w[t] + b[t];
  }
}

// GPT-2's GELU, the tanh form, on n values: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), 8
// at a time. tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2 |u|), by exp_nonpositive; the
// cancellation in 1 - e near u = 0 costs relative precision where the 1 + tanh it is added to
// hides it.
void gelu_tanh(const float* x, int64_t n, float* y) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  auto eight = [&](__m256 v) {
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
    const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), cube, v));
    const __m256 e = exp_nonpositive(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign_bit, u)));
    const __m256 magnitude = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    const __m256 tanh = _mm256_or_ps(magnitude, _mm256_and_ps(sign_bit, u));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh));
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, eight(_mm256_loadu_ps(x + i)));
  if (i < n) {  // the tail through a vector of its own, so every value takes the same operations
    float tail[8] = {};
    std::copy(x + i, x + n, tail);
    _mm256_storeu_ps(tail, eight(_mm256_loadu_ps(tail)));
    std::copy(tail, tail + (n - i), y + i);
  }
}

// model/gpt2.py's LayerNorm over x's last dimension, or None where the kernel cannot take it.
MaybeTensor layer_norm(const Tensor& input, const MaybeTensor& weight, const MaybeTensor& bias, double eps) {
  if (input.dim() < 1 || !is_cpu_float(input) || input.numel() == 0) return std::nullopt;
  const int64_t width = input.size(-1);
  if (!is_float_vector(weight, width) || !is_float_vector(bias, width)) return std::nullopt;
  const Tensor x = input.contiguous();
  Tensor y = at::empty(input.sizes(), input.options());
  layer_norm_rows(x.data_ptr<float>(), x.numel() / width, width, weight->data_ptr<float>(), bias->data_ptr<float>(),
                  static_cast<float>(eps), y.data_ptr<float>());
  return y;
}

// GPT-2's GELU of every value of x, or None where the kernel cannot take it.
MaybeTensor gelu(const Tensor& input) {
  if (!is_cpu_float(input)) return std::nullopt;
  const Tensor x = input.contiguous();
  Tensor y = at::empty(input.sizes(), input.options());
  gelu_tanh(x.data_ptr<float>(), x.numel(), y.data_ptr<float>());
  return y;
}

// The index of each row's largest score, the first where several tie, as torch.argmax gives it
// (a NaN counts as the largest): one pass for the largest value, a second to where it first is.
// A tenth of PyTorch's time for a greedy step's 50,257 scores (its argmax reduction is not
// vectorised). None where the kernel cannot take the scores.
MaybeTensor argmax(const Tensor& scores) {
  if (scores.dim() != 2 || !is_cpu_float(scores) || !scores.is_contiguous() || scores.size(1) == 0) return std::nullopt;
  const int64_t rows = scores.size(0), n = scores.size(1);
  Tensor picked = at::empty({rows, 1}, scores.options().dtype(at::kLong));
  for (int64_t r = 0; r < rows; r++) {
    const float* s = scores.data_ptr<float>() + r * n;
    __m256 top = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), unordered = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(s + i);
      top = _mm256_max_ps(top, v);
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float best = horizontal_max(top);
    bool nan = _mm256_movemask_ps(unordered) != 0;
    for (int64_t t = i; t < n; t++) {
      nan |= std::isnan(s[t]);
      best = std::max(best, s[t]);
    }
    int64_t at = 0;
    if (nan) {
      while (!std::isnan(s[at])) at++;
    } else {
      const __m256 wanted = _mm256_set1_ps(best);
      for (; at + 8 <= n; at += 8) {
        const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + at), wanted, _CMP_EQ_OQ));
        if (hits) break;
      }
      while (s[at] != best) at++;
    }
    picked.data_ptr<int64_t>()[r] = at;
  }
  return picked;
}

// A block's parameters, in the order kernels.py's decode_blocks gives them: each Linear as
// (weight, bias, scale: None for fp32).
enum Parameter { kLn1W, kLn1B, kAttnW, kAttnB, kAttnS, kProjW, kProjB, kProjS, kLn2W, kLn2B, kFcW, kFcB, kFcS,
                 kOutW, kOutB, kOutS, kParameters };

bool takes_product(const std::vector<MaybeTensor>& p, int first, int64_t out, int64_t in) {
  return p[first] && takes_weight(*p[first], p[first + 1], p[first + 2]) && p[first]->size(0) == out
         && p[first]->size(1) == in;
}

// Whether block b's parameters (p[b * kParameters...]) and KV cache layer fit decode_blocks: rows
// of `width`, `heads` heads.
bool block_fits(const std::vector<MaybeTensor>& all, int64_t b, int64_t rows, int64_t width, int64_t heads,
                const Tensor& keys, const Tensor& values, int64_t end) {
  const std::vector<MaybeTensor> p(all.begin() + b * kParameters, all.begin() + (b + 1) * kParameters);
  const int64_t hidden = p[kFcW] ? p[kFcW]->size(0) : 0;
  if (!is_float_vector(p[kLn1W], width) || !is_float_vector(p[kLn1B], width) || !is_float_vector(p[kLn2W], width)
      || !is_float_vector(p[kLn2B], width) || !takes_product(p, kAttnW, 3 * width, width)
      || !takes_product(p, kProjW, width, width) || !takes_product(p, kFcW, hidden, width)
      || !takes_product(p, kOutW, width, hidden))
    return false;
  for (const Tensor* cache : {&keys, &values})
    if (cache->dim() != 4 || !is_cpu_float(*cache) || !cache->is_contiguous() || cache->size(0) < rows
        || cache->size(1) != heads || cache->size(3) != width / heads || end <= 0 || end > cache->size(2))
      return false;
  return keys.sizes() == values.sizes();
}

// One pre-LN block of model/gpt2.py (parameters from p[first]) for one new token per row: y = x +
// attention(ln_1(x)), then y += mlp(ln_2(y)). Each step is the kernel the module path takes for
// the same rows (layer_norm, the products, the attention, gelu; the additions are single float
// ones, as PyTorch's), so the result is the module path's to the bit.
void run_block(const float* x, float* y, const std::vector<MaybeTensor>& all, int64_t first, float eps_1, float eps_2,
               int64_t rows, int64_t width, int64_t heads, const Tensor& keys, const Tensor& values,
               const int64_t* slot, int64_t end, const MaybeTensor& seen) {
  auto p = [&](int i) -> const MaybeTensor& { return all[first + i]; };
  auto f = [&](int i) { return p(i)->data_ptr<float>(); };
  const int64_t dim = width / heads, hidden = p(kFcW)->size(0);
  std::vector<float> normed(rows * width), qkv(rows * 3 * width), attended(rows * width), mid(rows * width),
      up(rows * hidden), activated(rows * hidden), down(rows * width);
  layer_norm_rows(x, rows, width, f(kLn1W), f(kLn1B), eps_1, normed.data());
  product(normed.data(), rows, *p(kAttnW), p(kAttnB), p(kAttnS), qkv.data());
  float *key_data = keys.data_ptr<float>(), *value_data = values.data_ptr<float>();
  const int64_t row_stride = keys.stride(0), head_stride = keys.stride(1);
  for (int64_t r = 0; r < rows; r++)  // the KV cache's update(): this token's keys and values at its slot
    for (int64_t head = 0; head < heads; head++) {
      const float* new_key = qkv.data() + r * 3 * width + width + head * dim;
      const int64_t at_slot = r * row_stride + head * head_stride + slot[r] * dim;
      std::copy(new_key, new_key + dim, key_data + at_slot);
      std::copy(new_key + width, new_key + width + dim, value_data + at_slot);
    }
  attend_rows({qkv.data(), key_data, value_data, 3 * width, dim, row_stride, head_stride, dim,
               seen ? seen->data_ptr<bool>() : nullptr, seen ? seen->stride(0) : 0, attended.data()},
              rows, heads, end, dim);
  product(attended.data(), rows, *p(kProjW), p(kProjB), p(kProjS), mid.data());
  for (int64_t i = 0; i < rows * width; i++) mid[i] = x[i] + mid[i];
  layer_norm_rows(mid.data(), rows, width, f(kLn2W), f(kLn2B), eps_2, normed.data());
  product(normed.data(), rows, *p(kFcW), p(kFcB), p(kFcS), up.data());
  gelu_tanh(up.data(), rows * hidden, activated.data());
  product(activated.data(), rows, *p(kOutW), p(kOutB), p(kOutS), down.data());
  for (int64_t i = 0; i < rows * width; i++) y[i] = mid[i] + down[i];
}

// Consecutive pre-LN blocks for one new token per row, in one call, where the module path takes a
// dozen calls a block with Python between them. Block b takes p[b * kParameters...], the layer
// norms' eps[2b], eps[2b + 1], and its KV cache layer keys[b], values[b] (rows at least, heads,
// slots, dim): it writes the token's keys and values at each row's slot and attends over the first
// `end` slots, `seen` marking those each row may see (None: all). Everything is checked before
// anything is written; None where a shape or type does not fit.
MaybeTensor decode_blocks(const Tensor& h, const std::vector<MaybeTensor>& p, const std::vector<double>& eps,
                          int64_t heads, const std::vector<Tensor>& keys, const std::vector<Tensor>& values,
                          const Tensor& slots, int64_t end, const MaybeTensor& seen) {
  const int64_t blocks = static_cast<int64_t>(keys.size());
  if (h.dim() != 3 || h.size(1) != 1 || !is_cpu_float(h) || !h.is_contiguous() || h.numel() == 0 || blocks == 0
      || p.size() != static_cast<size_t>(blocks * kParameters) || eps.size() != static_cast<size_t>(2 * blocks)
      || values.size() != keys.size() || heads <= 0)
    return std::nullopt;
  const int64_t rows = h.size(0), width = h.size(2);
  if ((width / heads) * heads != width || (width / heads) % 8 != 0) return std::nullopt;
  for (int64_t b = 0; b < blocks; b++)
    if (!block_fits(p, b, rows, width, heads, keys[b], values[b], end)) return std::nullopt;
  if (slots.dim() != 1 || slots.size(0) != rows || slots.scalar_type() != at::kLong || !slots.is_contiguous()
      || !slots.device().is_cpu() || !takes_mask(seen, rows, end))
    return std::nullopt;
  const int64_t* slot = slots.data_ptr<int64_t>();
  if (std::any_of(slot, slot + rows, [&](int64_t s) { return s < 0 || s >= end; })) return std::nullopt;

  Tensor y = at::empty(h.sizes(), h.options());
  std::vector<float> between(blocks > 1 ? rows * width : 0);  // block b's output, where it is not the last
  const float* x = h.data_ptr<float>();
  for (int64_t b = 0; b < blocks; b++) {
    // The last block writes y; the others alternate between `between` and y, so that no block
    // reads the buffer it writes.
    float* out = (blocks - 1 - b) % 2 == 0 ? y.data_ptr<float>() : between.data();
    run_block(x, out, p, b * kParameters, static_cast<float>(eps[2 * b]), static_cast<float>(eps[2 * b + 1]), rows,
              width, heads, keys[b], values[b], slot, end, seen);
    x = out;
  }
  return y;
}

// kInt8Dot, or AVX512-VNNI where Linux refused AMX's tiles: then every call takes vpdpbusd (and
// kernels.py builds that path instead, a build that says what it runs).
const char* int8_dot_taken() {
#ifdef __AMX_INT8__
  if (!amx_allowed()) return "AVX512-VNNI";
#endif
  return kInt8Dot;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("int8_dot") = int8_dot_taken();  // which path int8 products take in this build, here
  // Without the GIL: the scheduler decodes on its own thread while the app's threads serve.
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>());
  m.def("decode_attention", &decode_attention, py::call_guard<py::gil_scoped_release>());
  m.def("layer_norm", &layer_norm, py::call_guard<py::gil_scoped_release>());
  m.def("gelu", &gelu, py::call_guard<py::gil_scoped_release>());
  m.def("decode_blocks", &decode_blocks, py::call_guard<py::gil_scoped_release>());
  m.def("argmax", &argmax, py::call_guard<py::gil_scoped_release>());
}
