"""The CPU wing: kernels and tuning that only pay on a CPU host, registered into models/kernels.py on import.

    import models.cpu            # rl/setup.py does this when JAX's backend is the CPU; nothing else is needed

Importing it registers
  - "native" (rank 0 for "auto"): the compiled C++ expert kernel (native_kernels.py, sources in native/), taken for
    float32 without a mesh once the library is built (built on first use; MATHRL_NATIVE=0 turns it off);
  - "windowed" (rank 1): the decode dispatch for few tokens per expert (windowed.py);
  - the native decode-attention kernel for the sampler's cached steps (at most NATIVE_ATTENTION_MAX_T new tokens);
  - its record for `models.kernels.describe()`: whether the native library is in use, its name (the build key of
    sources, flags, jaxlib and CPU) and the SHA-256 of its bytes, or why not.
allocator.py (huge-page malloc, heap trimming after compiles) is process set-up the launcher calls itself.

The model core (models/layers.py, moe.py, moe_ep.py, transformer.py, sampling.py) never imports this package;
tests/test_layering.py checks it from the imports.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models import kernels, layers
from models.cpu import allocator, native_kernels, windowed

# The native decode-attention kernel is a loop over query rows: it beats XLA's batched tiny products at a decode
# step (M = G query rows per kv head) but not a prefill or a training forward, where XLA's products are real GEMMs.
NATIVE_ATTENTION_MAX_T = 4


def native_experts(p, x_ND, experts_NK, valid_NK, block_size=None):
    """The "native" expert kernel (any float dtype in and out, float32 inside); ValueError when it is not built."""
    if not native_kernels.available():
        raise ValueError("impl='native' needs the native expert kernel, which could not be built here "
                         "(see the warning above, or MATHRL_NATIVE=0)")
    return native_kernels.expert_ffn(p, x_ND.astype(jnp.float32), experts_NK, valid_NK).astype(x_ND.dtype)


def _native_claims(x_ND, p, k, mesh) -> bool:
    return native_kernels.applies(x_ND, p, mesh)


@jax.custom_vjp
def _native_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS):
    return native_kernels.decode_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS)


def _native_attention_fwd(q_BKMH, k_BKHS, v_BKSH, mask_BTS):
    return _native_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS), (q_BKMH, k_BKHS, v_BKSH, mask_BTS)


def _native_attention_bwd(res, d_out):
    # The kernel is forward-only; a differentiated cached step (rare: a short shared-prompt completion) takes
    # XLA's gradient of the same maths.
    q_BKMH, k_BKHS, v_BKSH, mask_BTS = res
    _, vjp = jax.vjp(lambda q, k, v: layers.grouped_attention(q, k, v, mask_BTS, True), q_BKMH, k_BKHS, v_BKSH)
    return (*vjp(d_out), None)


_native_attention.defvjp(_native_attention_fwd, _native_attention_bwd)


def _attention_applies(q_BKMH, k_BKHS, v_BKSH, mask_BTS) -> bool:
    return (mask_BTS.shape[1] <= NATIVE_ATTENTION_MAX_T
            and native_kernels.attention_applies(q_BKMH, k_BKHS, v_BKSH))


def describe() -> dict:
    """This wing's record: native_kernels.status() (built or why not) and the windowed threshold."""
    return {**native_kernels.status(), "windowed_max_load": windowed.WINDOWED_MAX_LOAD}


kernels.register_moe("native", native_experts, auto=_native_claims, rank=0)
kernels.register_moe("windowed", windowed.experts_windowed, auto=windowed.claims, rank=1)
kernels.register_attention(_attention_applies, _native_attention)
kernels.register_wing("cpu", describe)
if allocator.trims_at_phase_ends():
    kernels.register_phase_end(allocator.release_free_heap)
