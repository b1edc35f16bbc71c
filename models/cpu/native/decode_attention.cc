// Grouped-query softmax attention over a KV cache for few query rows (a decode step), as an XLA FFI custom call.
//
// out[b, k, m, :] = softmax_s(score[b, k, m, s]) @ v[b, k, s, :] with score = q[b, k, m, :] . keys[b, k, :, s]
// where mask[b, m % T, s], else -1e30 (models/layers.py's _MASK_VALUE: a fully masked row averages all slots, as
// XLA's softmax of equal scores does). The mask may be [1, T, S], shared by the batch. q is already scaled; m runs
// over the G * T query rows of kv head k. Keys are slots-last [B, K, H, S] and values [B, K, S, H], the cache's
// layouts. float32 throughout.
//
// Why it exists: at a decode step these are 128 (W1: 64 rows x 2 kv heads) products of [2, 64] x [64, S], which
// XLA's CPU dot runs at ~11 GFLOP/s; here each (row, kv head) is two vectorised passes over that head's keys and
// values, spread over XLA's intra-op pool.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v16 __attribute__((vector_size(64), aligned(4)));
constexpr float kMaskValue = -1e30f;

// acc[0:n] += a * x[0:n]
inline void axpy(float a, const float* x, float* acc, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) *reinterpret_cast<v16*>(acc + i) += a * *reinterpret_cast<const v16*>(x + i);
  for (; i < n; ++i) acc[i] += a * x[i];
}

ffi::Error DecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> keys,
                               ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::U8> mask,
                               ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = keys.dimensions(), vd = values.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 3 || kd[0] != qd[0] || kd[1] != qd[1] ||
      kd[2] != qd[3] || vd[0] != qd[0] || vd[1] != qd[1] || vd[2] != kd[3] || vd[3] != qd[3] ||
      (md[0] != qd[0] && md[0] != 1) || md[2] != kd[3] || md[1] < 1 || qd[2] % md[1] != 0)
    return ffi::Error::InvalidArgument("decode_attention: expected q [B, K, M, H], keys [B, K, H, S], values "
                                       "[B, K, S, H], mask [B or 1, T, S] with M a multiple of T");
  const int64_t B = qd[0], K = qd[1], M = qd[2], H = qd[3], S = kd[3], T = md[1];
  const float *qp = q.typed_data(), *kp = keys.typed_data(), *vp = values.typed_data();
  const uint8_t* mp = mask.typed_data();
  float* op = out->typed_data();
  const int64_t heads = B * K;
  const int chunks = static_cast<int>(std::min<int64_t>(heads, 16));
  mathrl::parallel_for(pool, chunks, [&](int c) {
    std::vector<float> score(S);
    for (int64_t bk = c * heads / chunks; bk < (c + 1) * heads / chunks; ++bk) {
      const float* key = kp + bk * H * S;
      const float* value = vp + bk * S * H;
      for (int64_t m = 0; m < M; ++m) {
        const float* qr = qp + (bk * M + m) * H;
        std::fill(score.begin(), score.end(), 0.f);
        for (int64_t h = 0; h < H; ++h) axpy(qr[h], key + h * S, score.data(), S);
        const uint8_t* allowed = mp + ((md[0] == 1 ? 0 : bk / K) * T + m % T) * S;
        float top = kMaskValue;
        for (int64_t s = 0; s < S; ++s) {
          if (!allowed[s]) score[s] = kMaskValue;
          top = std::max(top, score[s]);
        }
        float total = 0.f;
        for (int64_t s = 0; s < S; ++s) total += (score[s] = std::exp(score[s] - top));
        float* o = op + (bk * M + m) * H;
        std::fill(o, o + H, 0.f);
        const float inv = 1.f / total;
        for (int64_t s = 0; s < S; ++s) axpy(score[s] * inv, value + s * H, o, H);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DecodeAttention, DecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, K, M, H], scaled
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keys [B, K, H, S]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // values [B, K, S, H]
                                  .Arg<ffi::Buffer<ffi::U8>>()   // mask [B or 1, T, S], nonzero = may attend
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out [B, K, M, H]
);
