"""This package's own Triton kernels (the symmetric product, the stacked write) and where they run."""
