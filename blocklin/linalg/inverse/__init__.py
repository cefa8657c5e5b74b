"""The inverse (``blocklin.inv``): its routes, the tile kernels with their declared memory, and the
Newton-Schulz refinement."""
