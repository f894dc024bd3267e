"""The tracer's census of live tensors (tracer._live): reusing the last census while no gc
collection of generation 1 or 2 has run finds exactly what a walk of the whole heap finds."""
import gc
import random

import numpy as np

import tapegrad
from tapegrad import Tensor
from tapegrad.compiler import tracer


def _classes():
    return tracer._subclasses(Tensor) | {tapegrad.random.Generator}


def _heap_walk():
    classes = _classes()
    return {id(o) for o in gc.get_objects() if type(o) in classes}


def test_census_equals_a_heap_walk_through_allocations_frees_and_collections():
    rng = random.Random(0)
    keep, reused = [], 0
    for i in range(200):
        r = rng.random()
        if r < 0.3:
            keep.append(tapegrad.randn(3))
        elif r < 0.4 and keep:
            keep.pop(rng.randrange(len(keep)))
        elif r < 0.45:
            gc.collect(rng.choice([0, 1, 2]))
        elif r < 0.5:
            keep.append(tapegrad.nn.Linear(2, 2))
        elif r < 0.55:
            keep.append([[] for _ in range(3000)])  # enough objects for young collections
        elif r < 0.6:
            keep.append(tapegrad.Generator())
        census = tracer._CENSUS[0] if tracer._CENSUS else None
        reused += census is not None and census.key == tracer._gc_key()
        found = tracer._live()
        ids = [id(o) for o in found]
        assert len(ids) == len(set(ids)), i
        assert set(ids) == _heap_walk(), i
    assert reused > 150  # the cheap path ran (the gc callback carried it), and agreed


def test_state_made_between_compiles_is_read_by_reference():
    x = tapegrad.randn(4)
    first = tapegrad.compile(lambda a: a * 2)
    first(x)
    w = tapegrad.randn(4)  # after the last census, still in a young generation
    f = tapegrad.compile(lambda a: a * w)
    np.testing.assert_array_equal(f(x).numpy(), (x * w).numpy())
    np.testing.assert_array_equal(f(x).numpy(), (x * w).numpy())
    assert not f.breaks
    with tapegrad.no_grad():
        w.mul_(3)  # read by reference: the compiled call sees the new values
    np.testing.assert_array_equal(f(x).numpy(), (x * w).numpy())


def test_census_stops_carrying_after_idle_collections_then_walks_the_heap():
    tracer._live()
    census = tracer._CENSUS[0]
    assert census.key == tracer._gc_key()
    for _ in range(census.IDLE + 2):
        gc.collect(1)
    assert census.key is None  # the callback stopped its work
    w = tapegrad.randn(2)
    gc.collect(2)  # w is in generation 2, seen by no callback
    found = tracer._live()
    assert any(o is w for o in found)
    assert {id(o) for o in found} == _heap_walk()
    assert census.key == tracer._gc_key()


def test_census_forgets_dead_tensors():
    ts = [tapegrad.randn(2) for _ in range(100)]
    tracer._live()
    refs = tracer._CENSUS[0].refs
    assert all(refs[id(t)]() is t for t in ts)
    before = len(refs)
    del ts  # no weak reference outlives its tensor (a memory test would count them)
    assert len(refs) <= before - 100
