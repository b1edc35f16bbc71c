// Dropless routed SwiGLU experts for few tokens on CPU (a decode step, a short prefill), as an XLA FFI custom call.
//
// y[n, j, :] = (silu(x[n] @ w_gate[e]) * (x[n] @ w_up[e])) @ w_down[e] with e = experts[n, j]; y[n, j, :] = 0 where
// experts[n, j] is outside [0, E) (padding / masked assignments). float32 in, float32 out, float32 accumulation.
//
// Why it exists: at a decode step every expert gets a handful of rows, and the layer is bound by streaming the
// experts' weights (W1: 12 MiB per layer, 48 MiB for four, more than a small VM's usable cache). XLA's CPU batched
// matmul at these shapes read the weights at roughly half the rate PyTorch's kernels did on the same machine
// (git show 013a184:BENCHMARKS.md). Here each expert's weights are streamed once, in column panels, and every row routed to that
// expert is multiplied against a panel while it is in cache. Experts are spread over XLA's intra-op thread pool.
//
// Built by models/cpu/native_kernels.py with the host compiler (-O3 -march=native); GCC vector extensions keep it portable
// (512-bit vectors lower to AVX-512 where the CPU has it, to pairs of AVX2 registers otherwise).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "parallel.h"
#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using mathrl::kLanes;
using mathrl::v16;
constexpr int kRows = 6;  // rows per register tile: kRows x kCols vectors of accumulators
constexpr int kCols = 4;  // vectors (of 16 floats) per register tile's row
// Software prefetch this many rows of w ahead. A panel's rows are n floats apart (2 KiB for W1's gate), too far
// for the hardware prefetchers to follow within a page; prefetching cut W1's decode layer from 0.71-0.83 to
// 0.59-0.65 ms on 2 threads (1.96 to 1.35 ms on one).
constexpr int kPrefetchRows = 16;

// out_rows[r][0:n] = sum_k in_rows[r][k] * w[k, 0:n] for r < m; w is [K, n] row-major with leading dimension n.
// Column panels of kCols vectors outermost, so a [K, 64] panel of w is read from memory once and then served from
// cache to every row tile.
template <int R, int C>
inline void tile(const float* const* in_rows, const float* w, int K, int n, int c0, float* const* out_rows) {
  v16 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = (v16){};
  for (int k = 0; k < K; ++k) {
    const float* wk = w + static_cast<int64_t>(k) * n + c0;
    for (int c = 0; c < C; ++c) __builtin_prefetch(wk + kPrefetchRows * n + c * kLanes);
    v16 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = *reinterpret_cast<const v16*>(wk + c * kLanes);
    for (int r = 0; r < R; ++r) {
      const float xv = in_rows[r][k];
      for (int c = 0; c < C; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) *reinterpret_cast<v16*>(out_rows[r] + c0 + c * kLanes) = acc[r][c];
}

template <int C>
inline void row_tiles(const float* const* in_rows, const float* w, int m, int K, int n, int c0,
                      float* const* out_rows) {
  int r = 0;
  for (; r + kRows <= m; r += kRows) tile<kRows, C>(in_rows + r, w, K, n, c0, out_rows + r);
  switch (m - r) {
    case 1: tile<1, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    case 2: tile<2, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    case 3: tile<3, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    case 4: tile<4, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    case 5: tile<5, C>(in_rows + r, w, K, n, c0, out_rows + r); break;
    default: break;
  }
}

void matmul_rows(const float* const* in_rows, const float* w, int m, int K, int n, float* const* out_rows) {
  int c0 = 0;
  for (; c0 + kCols * kLanes <= n; c0 += kCols * kLanes) row_tiles<kCols>(in_rows, w, m, K, n, c0, out_rows);
  for (; c0 + kLanes <= n; c0 += kLanes) row_tiles<1>(in_rows, w, m, K, n, c0, out_rows);
  for (; c0 < n; ++c0) {  // columns past the last full vector (widths not a multiple of 16)
    for (int r = 0; r < m; ++r) {
      float s = 0.f;
      for (int k = 0; k < K; ++k) s += in_rows[r][k] * w[static_cast<int64_t>(k) * n + c0];
      out_rows[r][c0] = s;
    }
  }
}

// out[c][0:n] = sum_k a_rows[k][c] * b_rows[k][0:n] for c < a_cols: A^T B over m rows without transposing A (a
// register tile's R scalars per k are adjacent in A's row). The weight-gradient form.
template <int R, int C>
inline void tile_tn(const float* const* a_rows, int c, const float* const* b_rows, int m, int c0,
                    float* const* out_rows) {
  v16 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = (v16){};
  for (int k = 0; k < m; ++k) {
    const float* bk = b_rows[k] + c0;
    const float* ak = a_rows[k] + c;
    v16 bv[C];
    for (int j = 0; j < C; ++j) bv[j] = *reinterpret_cast<const v16*>(bk + j * kLanes);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < C; ++j) acc[r][j] += ak[r] * bv[j];
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) *reinterpret_cast<v16*>(out_rows[c + r] + c0 + j * kLanes) = acc[r][j];
}

template <int C>
inline void col_tiles_tn(const float* const* a_rows, int a_cols, const float* const* b_rows, int m, int c0,
                         float* const* out_rows) {
  int c = 0;
  for (; c + kRows <= a_cols; c += kRows) tile_tn<kRows, C>(a_rows, c, b_rows, m, c0, out_rows);
  switch (a_cols - c) {
    case 1: tile_tn<1, C>(a_rows, c, b_rows, m, c0, out_rows); break;
    case 2: tile_tn<2, C>(a_rows, c, b_rows, m, c0, out_rows); break;
    case 3: tile_tn<3, C>(a_rows, c, b_rows, m, c0, out_rows); break;
    case 4: tile_tn<4, C>(a_rows, c, b_rows, m, c0, out_rows); break;
    case 5: tile_tn<5, C>(a_rows, c, b_rows, m, c0, out_rows); break;
    default: break;
  }
}

void matmul_tn(const float* const* a_rows, int a_cols, const float* const* b_rows, int n, int m,
               float* const* out_rows) {
  int c0 = 0;
  for (; c0 + kCols * kLanes <= n; c0 += kCols * kLanes) col_tiles_tn<kCols>(a_rows, a_cols, b_rows, m, c0, out_rows);
  for (; c0 + kLanes <= n; c0 += kLanes) col_tiles_tn<1>(a_rows, a_cols, b_rows, m, c0, out_rows);
  for (; c0 < n; ++c0)
    for (int c = 0; c < a_cols; ++c) {
      float s = 0.f;
      for (int k = 0; k < m; ++k) s += a_rows[k][c] * b_rows[k][c0];
      out_rows[c][c0] = s;
    }
}

// Matrices as row pointers over a contiguous [rows, cols] buffer.
struct Rows {
  std::vector<float> data;
  std::vector<float*> rows;
  Rows(int m, int cols) : data(static_cast<size_t>(m) * cols), rows(m) {
    for (int r = 0; r < m; ++r) rows[r] = data.data() + static_cast<size_t>(r) * cols;
  }
  const float* const* in() const { return rows.data(); }
  float* const* out() const { return rows.data(); }
};

inline float sigmoid(float g) { return 1.f / (1.f + std::exp(-g)); }

// Forward of one expert: its m rows through gate / up, silu(gate) * up, then down, written to their output rows.
// gate_rows / up_rows receive the pre-activations (the residuals the backward reads); they may be scratch.
void expert_forward(const float* const* x_rows, float* const* y_rows, float* const* gate_rows,
                    float* const* up_rows, int m, const float* wg, const float* wu, const float* wd, int D, int F) {
  matmul_rows(x_rows, wg, m, D, F, gate_rows);
  matmul_rows(x_rows, wu, m, D, F, up_rows);
  Rows h(m, F);
  for (int r = 0; r < m; ++r) {
    const float *g = gate_rows[r], *u = up_rows[r];
    float* o = h.rows[r];
    int f = 0;
    for (; f + kLanes <= F; f += kLanes) {
      const v16 gv = mathrl::load(g + f);
      mathrl::store(o + f, gv * mathrl::sigmoid16(gv) * mathrl::load(u + f));
    }
    for (; f < F; ++f) o[f] = g[f] * sigmoid(g[f]) * u[f];
  }
  matmul_rows(h.in(), wd, m, F, D, y_rows);
}

// Backward of one expert from the forward's residuals (gate / up pre-activations of its m rows): weight gradients
// into dwg / dwu / dwd (this expert's [D, F], [D, F], [F, D] slices, overwritten) and each row's input gradient into
// dx_rows. wd_t is w_down^T [D, F] and wgu_t [w_gate^T ; w_up^T] [2F, D] (transposed by XLA before the call, so every
// product here is a plain one). Five products, none of them the forward's again.
void expert_backward(const float* const* x_rows, const float* const* dy_rows, const float* const* gate_rows,
                     const float* const* up_rows, float* const* dx_rows, int m, const float* wd_t,
                     const float* wgu_t, float* dwg, float* dwu, float* dwd, int D, int F) {
  Rows h(m, F), dh(m, F);
  matmul_rows(dy_rows, wd_t, m, D, F, dh.out());  // dH = dY w_down^T
  // h = silu(g) * u; du = dH * silu(g); dg = dH * u * silu'(g).
  Rows dgu(m, 2 * F);  // [dg | du] side by side: dX = [dg | du] [w_gate^T ; w_up^T] is one product
  for (int r = 0; r < m; ++r) {
    const float *g = gate_rows[r], *u = up_rows[r], *d = dh.rows[r];
    float *o = dgu.rows[r], *hr = h.rows[r];
    int f = 0;
    for (; f + kLanes <= F; f += kLanes) {
      using namespace mathrl;
      const v16 gv = load(g + f), uv = load(u + f), dv = load(d + f);
      const v16 sv = sigmoid16(gv), silu = gv * sv;
      store(o + F + f, dv * silu);
      store(o + f, dv * uv * sv * (splat(1.f) + gv * (splat(1.f) - sv)));
      store(hr + f, silu * uv);
    }
    for (; f < F; ++f) {  // widths not a multiple of 16
      const float s = sigmoid(g[f]), silu = g[f] * s;
      o[F + f] = d[f] * silu;
      o[f] = d[f] * u[f] * s * (1.f + g[f] * (1.f - s));
      hr[f] = silu * u[f];
    }
  }
  std::vector<const float*> du_rows(m);
  for (int r = 0; r < m; ++r) du_rows[r] = dgu.rows[r] + F;
  std::vector<float*> out(std::max(D, F));
  auto rows_of = [&](float* base, int rows, int cols) {
    for (int r = 0; r < rows; ++r) out[r] = base + static_cast<size_t>(r) * cols;
    return out.data();
  };
  matmul_tn(h.in(), F, dy_rows, D, m, rows_of(dwd, F, D));           // dW_down = h^T dY
  matmul_tn(x_rows, D, dgu.in(), F, m, rows_of(dwg, D, F));          // dW_gate = x^T dg
  matmul_tn(x_rows, D, du_rows.data(), F, m, rows_of(dwu, D, F));    // dW_up = x^T du
  matmul_rows(dgu.in(), wgu_t, m, 2 * F, D, dx_rows);                // dX = [dg | du] [w_gate^T ; w_up^T]
}

// fn(e) for every listed expert, spread over XLA's pool.
void for_each_expert(ffi::ThreadPool& pool, const std::vector<int>& order, std::function<void(int)> fn) {
  mathrl::parallel_for(pool, static_cast<int>(order.size()), [&](int i) { fn(order[i]); });
}

// Each expert's assignments (index a = n * k + j), and the experts with any, largest first.
struct Routing {
  std::vector<std::vector<int64_t>> rows;
  std::vector<int> order;
  Routing(const int32_t* ids, int64_t A, int64_t E) : rows(E) {
    for (int64_t a = 0; a < A; ++a)
      if (ids[a] >= 0 && ids[a] < E) rows[ids[a]].push_back(a);
    for (int e = 0; e < E; ++e)
      if (!rows[e].empty()) order.push_back(e);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rows[a].size() > rows[b].size(); });
  }
};

bool shapes_ok(ffi::Span<const int64_t> xd, ffi::Span<const int64_t> ed, ffi::Span<const int64_t> gd,
               ffi::Span<const int64_t> ud, ffi::Span<const int64_t> dd) {
  return xd.size() == 2 && ed.size() == 2 && gd.size() == 3 && ud.size() == 3 && dd.size() == 3 && ed[0] == xd[0] &&
         gd[1] == xd[1] && ud[0] == gd[0] && ud[1] == gd[1] && ud[2] == gd[2] && dd[0] == gd[0] && dd[1] == gd[2] &&
         dd[2] == gd[1];
}

bool same_dims(ffi::Span<const int64_t> a, ffi::Span<const int64_t> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

const char kShapeError[] = "expert_ffn: expected x [N, D], experts [N, k], w_gate / w_up [E, D, F], w_down [E, F, D]";

// The forward over all experts; gate_p / up_p (both or neither) receive each assignment's pre-activations
// [N * k, F] for the backward, otherwise they live in per-expert scratch.
ffi::Error forward_all(ffi::ThreadPool& pool, ffi::Buffer<ffi::F32>& x, ffi::Buffer<ffi::S32>& experts,
                       ffi::Buffer<ffi::F32>& w_gate, ffi::Buffer<ffi::F32>& w_up, ffi::Buffer<ffi::F32>& w_down,
                       float* yp, float* gate_p, float* up_p) {
  if (!shapes_ok(x.dimensions(), experts.dimensions(), w_gate.dimensions(), w_up.dimensions(), w_down.dimensions()))
    return ffi::Error::InvalidArgument(kShapeError);
  const int64_t N = x.dimensions()[0], D = x.dimensions()[1], K = experts.dimensions()[1];
  const int64_t E = w_gate.dimensions()[0], F = w_gate.dimensions()[2];
  const float* xp = x.typed_data();
  std::memset(yp, 0, sizeof(float) * N * K * D);  // masked assignments stay zero
  Routing routing(experts.typed_data(), N * K, E);
  const float *wg = w_gate.typed_data(), *wu = w_up.typed_data(), *wd = w_down.typed_data();
  for_each_expert(pool, routing.order, [&](int e) {
    const auto& a = routing.rows[e];
    const int m = static_cast<int>(a.size());
    std::vector<const float*> x_rows(m);
    std::vector<float*> y_rows(m), gate_rows(m), up_rows(m);
    std::unique_ptr<Rows> gate_scratch, up_scratch;
    if (gate_p == nullptr) {
      gate_scratch = std::make_unique<Rows>(m, F);
      up_scratch = std::make_unique<Rows>(m, F);
    }
    for (int i = 0; i < m; ++i) {
      x_rows[i] = xp + (a[i] / K) * D;
      y_rows[i] = yp + a[i] * D;
      gate_rows[i] = gate_p ? gate_p + a[i] * F : gate_scratch->rows[i];
      up_rows[i] = up_p ? up_p + a[i] * F : up_scratch->rows[i];
    }
    const int64_t g = D * F;
    expert_forward(x_rows.data(), y_rows.data(), gate_rows.data(), up_rows.data(), m, wg + e * g, wu + e * g,
                   wd + e * g, static_cast<int>(D), static_cast<int>(F));
  });
  return ffi::Error::Success();
}

ffi::Error ExpertFfnImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> experts,
                         ffi::Buffer<ffi::F32> w_gate, ffi::Buffer<ffi::F32> w_up, ffi::Buffer<ffi::F32> w_down,
                         ffi::ResultBuffer<ffi::F32> y) {
  return forward_all(pool, x, experts, w_gate, w_up, w_down, y->typed_data(), nullptr, nullptr);
}

// The forward that also returns the residuals, for the train step (the backward then repeats none of it).
ffi::Error ExpertFfnResImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> experts,
                            ffi::Buffer<ffi::F32> w_gate, ffi::Buffer<ffi::F32> w_up, ffi::Buffer<ffi::F32> w_down,
                            ffi::ResultBuffer<ffi::F32> y, ffi::ResultBuffer<ffi::F32> gate,
                            ffi::ResultBuffer<ffi::F32> up) {
  const auto gd = gate->dimensions();
  if (gd.size() != 3 || gd[0] != x.dimensions()[0] || w_gate.dimensions().size() != 3 ||
      gd[2] != w_gate.dimensions()[2] || !same_dims(up->dimensions(), gd))
    return ffi::Error::InvalidArgument("expert_ffn_res: expected gate / up residuals [N, k, F]");
  return forward_all(pool, x, experts, w_gate, w_up, w_down, y->typed_data(), gate->typed_data(),
                     up->typed_data());
}

ffi::Error ExpertFfnBwdImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> experts,
                            ffi::Buffer<ffi::F32> gate, ffi::Buffer<ffi::F32> up, ffi::Buffer<ffi::F32> w_down_t,
                            ffi::Buffer<ffi::F32> w_gate_up_t, ffi::Buffer<ffi::F32> dy, ffi::ResultBuffer<ffi::F32> dx,
                            ffi::ResultBuffer<ffi::F32> dw_gate, ffi::ResultBuffer<ffi::F32> dw_up,
                            ffi::ResultBuffer<ffi::F32> dw_down) {
  const auto xd = x.dimensions(), ed = experts.dimensions(), wdt = w_down_t.dimensions();
  const auto wgut = w_gate_up_t.dimensions(), gd = gate.dimensions(), dyd = dy.dimensions();
  if (xd.size() != 2 || ed.size() != 2 || ed[0] != xd[0] || wdt.size() != 3 || wdt[1] != xd[1] ||
      wgut.size() != 3 || wgut[0] != wdt[0] || wgut[1] != 2 * wdt[2] || wgut[2] != wdt[1] || gd.size() != 3 ||
      gd[0] != xd[0] || gd[1] != ed[1] || gd[2] != wdt[2] || !same_dims(up.dimensions(), gd) || dyd.size() != 3 ||
      dyd[0] != xd[0] || dyd[1] != ed[1] || dyd[2] != xd[1])
    return ffi::Error::InvalidArgument("expert_ffn_bwd: expected x [N, D], experts [N, k], gate / up [N, k, F], "
                                       "w_down^T [E, D, F], [w_gate^T ; w_up^T] [E, 2F, D], dy [N, k, D]");
  const int64_t N = xd[0], D = xd[1], K = ed[1];
  const int64_t E = wdt[0], F = wdt[2], g = D * F;
  const float *xp = x.typed_data(), *dyp = dy.typed_data(), *gp = gate.typed_data(), *up_p = up.typed_data();
  Routing routing(experts.typed_data(), N * K, E);
  std::vector<float> dx_a(static_cast<size_t>(N * K * D), 0.f);  // per assignment: no two experts write one row
  float *dwg = dw_gate->typed_data(), *dwu = dw_up->typed_data(), *dwd = dw_down->typed_data();
  for (int e = 0; e < E; ++e)
    if (routing.rows[e].empty()) {  // an expert with no rows gets zero gradients
      std::memset(dwg + e * g, 0, sizeof(float) * g);
      std::memset(dwu + e * g, 0, sizeof(float) * g);
      std::memset(dwd + e * g, 0, sizeof(float) * g);
    }
  const float *wdt_p = w_down_t.typed_data(), *wgut_p = w_gate_up_t.typed_data();
  for_each_expert(pool, routing.order, [&](int e) {
    const auto& a = routing.rows[e];
    const int m = static_cast<int>(a.size());
    std::vector<const float*> x_rows(m), dy_rows(m), gate_rows(m), up_rows(m);
    std::vector<float*> dx_rows(m);
    for (int i = 0; i < m; ++i) {
      x_rows[i] = xp + (a[i] / K) * D;
      dy_rows[i] = dyp + a[i] * D;
      gate_rows[i] = gp + a[i] * F;
      up_rows[i] = up_p + a[i] * F;
      dx_rows[i] = dx_a.data() + a[i] * D;
    }
    expert_backward(x_rows.data(), dy_rows.data(), gate_rows.data(), up_rows.data(), dx_rows.data(), m,
                    wdt_p + e * g, wgut_p + 2 * e * g, dwg + e * g, dwu + e * g, dwd + e * g, static_cast<int>(D),
                    static_cast<int>(F));
  });
  float* dxp = dx->typed_data();
  for (int64_t n = 0; n < N; ++n) {
    float* out = dxp + n * D;
    std::memcpy(out, &dx_a[static_cast<size_t>(n * K * D)], sizeof(float) * D);
    for (int64_t j = 1; j < K; ++j) {
      const float* src = &dx_a[static_cast<size_t>((n * K + j) * D)];
      for (int64_t d = 0; d < D; ++d) out[d] += src[d];
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ExpertFfn, ExpertFfnImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [N, D]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // experts [N, k], outside [0, E): no row
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_gate [E, D, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_up [E, D, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_down [E, F, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [N, k, D]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(ExpertFfnRes, ExpertFfnResImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [N, D]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // experts [N, k], outside [0, E): no row
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_gate [E, D, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_up [E, D, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_down [E, F, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [N, k, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // gate pre-activations [N, k, F]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // up pre-activations [N, k, F]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(ExpertFfnBwd, ExpertFfnBwdImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [N, D]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // experts [N, k]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // gate pre-activations [N, k, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // up pre-activations [N, k, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w_down^T [E, D, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // [w_gate^T ; w_up^T] [E, 2F, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dy [N, k, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dx [N, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dw_gate [E, D, F]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dw_up [E, D, F]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dw_down [E, F, D]
);
