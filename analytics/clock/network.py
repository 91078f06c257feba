"""The network effect: all pairwise estimates solved jointly over the probe graph.

Unknowns are one value per host (offset, or drift); every fitted pair (a, b)
says ``v_b - v_a = m_ab`` with weight ``w_ab = 1 / sigma_ab^2``. The weighted
least-squares solution makes every loop of the graph sum to zero. The normal
equations are the weighted graph Laplacian ``L v = A^T W m`` (scipy.sparse),
solved by Jacobi-preconditioned conjugate gradients: the probe graph is an
expander (random buddies), so CG converges in a few dozen iterations where a
sparse factorisation would fill in. ``L`` is singular (one free constant per
connected component); the right-hand side is consistent, so CG stays in the
range and the gauge is applied afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import lsqr


@dataclass
class GraphSolution:
    value: np.ndarray  # per host; NaN for hosts with no edge
    component: np.ndarray  # per host; -1 for hosts with no edge; 0 = largest component
    weight_sum: np.ndarray  # per host: sum of its edge weights
    residual: np.ndarray  # per edge: (v_b - v_a) - m_ab (NaN for unused edges)
    chi2_scale: float  # max(1, chi^2 / dof) of the whole fit


def components(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Component label per host (-1 for isolated), 0 = largest, then by size."""
    if len(a) == 0:
        return np.full(n, -1, np.intp)
    adj = sp.coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)).tocsr()
    _, labels = connected_components(adj, directed=False)
    deg = np.bincount(a, minlength=n) + np.bincount(b, minlength=n)
    labels = np.where(deg > 0, labels, -1)
    used = labels >= 0
    sizes = np.bincount(labels[used])
    order = np.argsort(-sizes, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    out = np.full(n, -1, np.intp)
    out[used] = rank[labels[used]]
    return out


def _pattern(
    ua: np.ndarray, ub: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Sparsity pattern of the Laplacian of edges (ua, ub) plus the diagonal, as CSR:
    ``(perm, indices, indptr)``; the matrix of entries ``data`` (ordered off-diagonal
    (a, b), then (b, a), then the diagonal) is ``csr_matrix((data[perm], indices, indptr))``.
    None when an edge repeats (its entries are sums: no single permutation)."""
    rows = np.concatenate((ua, ub, np.arange(n)))
    cols = np.concatenate((ub, ua, np.arange(n)))
    order = sp.csr_matrix((np.arange(len(rows), dtype=np.float64), (rows, cols)), shape=(n, n))
    if order.nnz != len(rows):
        return None
    return order.data.astype(np.intp), order.indices, order.indptr


# Graphs kept by a cache (a window's solves, and the next window's: the probe graph is
# the same from window to window unless hosts or pairs come or go).
_CACHED_GRAPHS = 4


def _graph(
    ua: np.ndarray, ub: np.ndarray, n: int, cache: dict | None
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
    """Components and Laplacian pattern of the edges (ua, ub) over n hosts; from
    ``cache["graphs"]`` (most recent first) when the same edges were seen there."""
    graphs: list = cache.setdefault("graphs", []) if cache is not None else []
    for i, (ga, gb, gn, comp, pattern) in enumerate(graphs):
        if gn == n and np.array_equal(ga, ua) and np.array_equal(gb, ub):
            graphs.insert(0, graphs.pop(i))
            return comp, pattern
    comp, pattern = components(ua, ub, n), _pattern(ua, ub, n)
    graphs.insert(0, (ua, ub, n, comp, pattern))
    del graphs[_CACHED_GRAPHS:]
    return comp, pattern


def _cg(
    lap: sp.csr_matrix,
    rhs: np.ndarray,
    x0: np.ndarray,
    inv_diag: np.ndarray,
    atol: float,
    maxiter: int,
) -> tuple[np.ndarray, int]:
    """Jacobi-preconditioned conjugate gradients: ``scipy.sparse.linalg.cg``'s iteration
    step for step (the same floating-point operations in the same order, so the same
    bits), without its per-iteration wrapping of the matrix and the preconditioner as
    linear operators. Stops when ``|r| < atol``; returns ``(x, 0)``, or ``(x, maxiter)``
    when it did not converge."""
    x = x0.copy()
    r = rhs - lap @ x if x.any() else rhs.copy()
    rho_prev = 1.0
    p = np.empty_like(r)
    for it in range(maxiter):
        if np.linalg.norm(r) < atol:
            return x, 0
        z = inv_diag * r
        rho = np.dot(r, z)
        if it > 0:
            p *= rho / rho_prev
            p += z
        else:
            p[:] = z
        q = lap @ p
        alpha = rho / np.dot(p, q)
        x += alpha * p
        r -= alpha * q
        rho_prev = rho
    return x, maxiter


def solve(
    a: np.ndarray,
    b: np.ndarray,
    m: np.ndarray,
    w: np.ndarray,
    n: int,
    *,
    x0: np.ndarray | None = None,
    cache: dict | None = None,
) -> GraphSolution:
    """Weighted least squares over the graph, each component's mean set to zero.

    Edges with ``w <= 0`` or non-finite ``m`` are ignored. Solves of one window pass
    the same ``cache`` (a dict): when the edges in use are the same as last time, the
    components and the Laplacian's sparsity pattern are reused."""
    use = (w > 0) & np.isfinite(m) & np.isfinite(w) & (a != b)
    ua, ub, um, uw = a[use], b[use], m[use], w[use]
    comp, pattern = _graph(ua, ub, n, cache)
    wsum = np.bincount(ua, uw, minlength=n) + np.bincount(ub, uw, minlength=n)
    value = np.full(n, np.nan)
    residual = np.full(len(a), np.nan)
    if len(ua) == 0:
        return GraphSolution(value, comp, wsum, residual, 1.0)
    rhs = np.bincount(ub, uw * um, minlength=n) - np.bincount(ua, uw * um, minlength=n)
    data = np.concatenate((-uw, -uw, wsum))
    if pattern is not None:
        perm, indices, indptr = pattern
        lap = sp.csr_matrix((np.take(data, perm, mode="wrap"), indices, indptr), shape=(n, n))
    else:  # repeated edges: let scipy sum them
        rows = np.concatenate((ua, ub, np.arange(n)))
        cols = np.concatenate((ub, ua, np.arange(n)))
        lap = sp.csr_matrix((data, (rows, cols)), shape=(n, n))
    diag = np.where(wsum > 0, wsum, 1.0)
    # Scale: solve for the value relative to a typical magnitude so the tolerance
    # is absolute in ns (or ns/ns) terms of the edges' own precision.
    start = np.zeros(n) if x0 is None else np.nan_to_num(x0)
    bnorm = float(np.linalg.norm(rhs))
    if bnorm == 0.0:
        v = np.zeros(n)
    else:
        atol = 1e-12 * bnorm
        v, info = _cg(lap, rhs, start, 1.0 / diag, atol, 5000)
        if info != 0:  # pragma: no cover - not seen on probe graphs; fall back
            v = lsqr(lap, rhs, atol=1e-14, btol=1e-14)[0]
    # Gauge: mean zero per component (callers may shift components afterwards).
    ncomp = int(comp.max()) + 1
    inc = comp >= 0
    sums = np.bincount(comp[inc], v[inc], minlength=ncomp)
    cnt = np.bincount(comp[inc], minlength=ncomp)
    v = v - np.where(inc, (sums / np.maximum(cnt, 1))[np.maximum(comp, 0)], 0.0)
    value[inc] = v[inc]
    res = (value[ub] - value[ua]) - um
    residual[use] = res
    dof = len(ua) - (n_used := int(inc.sum())) + ncomp
    chi2 = float((uw * res * res).sum())
    scale = max(1.0, chi2 / dof) if dof > 0 and n_used > 0 else 1.0
    return GraphSolution(value, comp, wsum, residual, scale)
