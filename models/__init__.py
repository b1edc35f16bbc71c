"""The policy: a Mixture-of-Experts decoder as pure functions over a parameter pytree."""
