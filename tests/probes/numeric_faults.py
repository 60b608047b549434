"""Wrong matrix products the matmul check must reject (CPU unit tests and the GPU calibration).

Each fault takes torch and returns an `op(a, b)` to pass to matmul_check / matmul_once.
"""

from __future__ import annotations


def zero_fraction(torch, fraction: float = 0.001, seed: int = 7):
    """0.1% of the outputs (at least one) set to zero, at seeded random places."""

    def op(a, b):
        c = torch.matmul(a, b)
        flat = c.view(-1)
        n = max(1, int(flat.numel() * fraction))
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(flat.numel(), generator=g)[:n].to(c.device)
        flat[idx] = 0
        return c

    return op


def flip_one_sign(torch, row: int = None, col: int = None):
    """One output's sign flipped (by default the element at a third of the rows and a fifth
    of the columns)."""

    def op(a, b):
        c = torch.matmul(a, b)
        i = c.shape[0] // 3 if row is None else row
        j = c.shape[1] // 5 if col is None else col
        c[i, j] = -c[i, j]
        return c

    return op


def drop_k_block(torch, blocks: int = 32):
    """The contribution of one block of K/blocks inner indices (from K/2 on) left out, as a
    kernel that skips one tile of its K loop would."""

    def op(a, b):
        k = a.shape[1]
        kb = max(1, k // blocks)
        k0 = k // 2
        return (torch.matmul(a[:, :k0], b[:k0]) + torch.matmul(a[:, k0 + kb :], b[k0 + kb :])).to(
            a.dtype
        )

    return op


FAULTS = {
    "zero_0.1%": zero_fraction,
    "one_sign_flipped": flip_one_sign,
    "one_k_block_dropped": drop_k_block,
}
