"""numba loops behind ``backend.scatter`` (imported only when numba is installed).

Each loop adds in the order numpy's ``add.at`` / ``bincount`` would, element for element, so
the results are theirs bit for bit; IEEE additions are not contracted (numba compiles without
fastmath). Each first checks its indices and returns False, writing nothing, if one lies
outside [-n, n): the caller then takes numpy's path, which raises numpy's own error.
"""
from numba import njit


@njit(cache=True, nogil=True)
def scatter_rows(out, rows, values):
    """``out[p, rows[i], q] += values[p, i, q]`` for i in order (numpy's ``add.at`` order);
    ``out`` may be wider than ``values`` (a float64 accumulator for float32 values: numba
    widens each value before adding, as ``bincount`` does with its weights)."""
    n = out.shape[1]
    for i in range(rows.shape[0]):
        if rows[i] < -n or rows[i] >= n:
            return False
    for p in range(out.shape[0]):
        for i in range(rows.shape[0]):
            r = rows[i]
            if r < 0:
                r += n
            o = out[p, r]
            v = values[p, i]
            for q in range(o.shape[0]):
                o[q] += v[q]
    return True


@njit(cache=True, nogil=True)
def sparse_rows(out, rows, cols, values, dense):
    """``out[rows[k]] += values[k] * dense[cols[k]]`` for k in order: each product rounded in
    the operands' dtype, then added into ``out`` (float64), as ``values[:, None] *
    dense[cols]`` followed by ``bincount`` computes it."""
    n, m = out.shape[0], dense.shape[0]
    for k in range(rows.shape[0]):
        if rows[k] < 0 or rows[k] >= n or cols[k] < 0 or cols[k] >= m:
            return False
    for k in range(rows.shape[0]):
        o = out[rows[k]]
        d = dense[cols[k]]
        v = values[k]
        for q in range(o.shape[0]):
            o[q] += v * d[q]
    return True


@njit(cache=True, nogil=True)
def scatter_flat(out, pos, values):
    """``out[pos[k]] += values[k]`` for k in order (one-dimensional ``add.at``'s order)."""
    n = out.shape[0]
    for k in range(pos.shape[0]):
        if pos[k] < 0 or pos[k] >= n:
            return False
    for k in range(pos.shape[0]):
        out[pos[k]] += values[k]
    return True


@njit(cache=True, nogil=True)
def scatter_axis(out, idx, values):
    """``out[p, idx[p, i, q], q] += values[p, i, q]`` for (p, i, q) in C order (numpy's
    ``add.at`` order for a gather/scatter key along the middle axis), negative indices
    wrapping."""
    n = out.shape[1]
    P, M, Q = idx.shape
    for p in range(P):
        for i in range(M):
            for q in range(Q):
                if idx[p, i, q] < -n or idx[p, i, q] >= n:
                    return False
    for p in range(P):
        for i in range(M):
            r = idx[p, i]
            v = values[p, i]
            o = out[p]
            for q in range(Q):
                j = r[q]
                if j < 0:
                    j += n
                o[j, q] += v[q]
    return True
