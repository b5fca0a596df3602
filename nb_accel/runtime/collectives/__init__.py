"""Collectives on tensor trees across a launch's processes (:mod:`.ops`), and copying a tensor
to every rank's device (:mod:`.tensor_sharing`); the worker's device backend runs them."""
