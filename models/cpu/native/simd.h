// 16-float vectors (GCC vector extensions) and the vectorised exp / sigmoid the CPU kernels in this folder share.
//
// Why: g++ does not vectorise std::exp without -ffast-math, and the SwiGLU's sigmoid was ~15% of the expert
// kernel's forward at W1's shapes (4.4M scalar expf calls per 4,352-token layer, 15 ms on one core; 2.2 ms as
// below). 512-bit vectors lower to AVX-512 where the CPU has it, to pairs of AVX2 registers otherwise.
#pragma once

namespace mathrl {

typedef float v16 __attribute__((vector_size(64), aligned(4)));  // unaligned loads and stores are allowed
typedef int vi16 __attribute__((vector_size(64), aligned(4)));
constexpr int kLanes = 16;

inline v16 splat(float x) { return (v16){} + x; }
inline v16 load(const float* p) { return *reinterpret_cast<const v16*>(p); }
inline void store(float* p, v16 v) { *reinterpret_cast<v16*>(p) = v; }

// e^x per lane, within ~2 ulp of expf for x in [-87, 88] (inputs are clamped to that range, so the result stays a
// finite float: ~1e-38 at the bottom, ~1.7e38 at the top). Cephes' scheme: x = n ln2 + r with |r| <= ln2 / 2
// (ln2 in two parts), a degree-6 polynomial for e^r, 2^n from the exponent bits.
inline v16 exp16(v16 x) {
  x = x < splat(88.0f) ? x : splat(88.0f);
  x = x > splat(-87.0f) ? x : splat(-87.0f);
  const v16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
  const v16 n = (x * splat(1.44269504088896341f) + magic) - magic;
  v16 r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  v16 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.f);
  const vi16 bits = (__builtin_convertvector(n, vi16) + 127) << 23;
  return p * reinterpret_cast<const v16&>(bits);
}

inline v16 sigmoid16(v16 g) { return splat(1.f) / (splat(1.f) + exp16(-g)); }

}  // namespace mathrl
