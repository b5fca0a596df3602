"""``nb_accel.utils.random``: where ``accelerate.utils.random`` names are."""

from ..runtime.data.rng import RNGType, set_seed, synchronize_rng_state, synchronize_rng_states

__all__ = ["RNGType", "set_seed", "synchronize_rng_state", "synchronize_rng_states"]
