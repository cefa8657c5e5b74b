"""Low-rank factorizations: ``blocklin.svd`` (randomized, sketch, Lanczos, Gram routes), block
Lanczos, ``blocklin.eigsh`` and ``blocklin.pca``."""
