"""transpose-tiling: which copies it tiles, the nest it leaves, and that the tiled programs compute the transpose."""

from __future__ import annotations

import tvm
from tvm import te, tirx

from conftest import assert_samples_correct
from probtune import Rng, Schedule, generate_space
from probtune.schedule.analysis import iter_stmts
from probtune.workloads.workload import Workload
from probtune_cpu.transpose_tiling import TransposeTiling, transposed_loop
from probtune_cpu.vector_unit import vector_width


def _workload(*tensors: te.Tensor) -> Workload:
    return Workload.from_module(tvm.IRModule({"main": te.create_prim_func(list(tensors))}))


def _attention_keys() -> Workload:
    """Attention's keys, (sequence, heads x 64) to (heads, 64, sequence): the sequence moves innermost."""
    keys = te.placeholder((128, 768), name="keys")
    out = te.compute((12, 64, 128), lambda h, d, s: keys[s, h * 64 + d], name="T_transpose")
    return _workload(keys, out)


def _kinds(space) -> list[str]:
    return [inst.kind for inst in space.trace.instructions]


def _loops(func: tirx.PrimFunc) -> list[tirx.For]:
    return [s for s in iter_stmts(func.body) if isinstance(s, tirx.For)]


def test_the_loop_contiguous_for_the_strided_side_is_found():
    sch = Schedule(_attention_keys().mod, rng=Rng(0))
    assert transposed_loop(sch, sch.get_sblock("T_transpose")) == (1, False)  # d: along the keys' rows


def test_a_copy_along_its_rows_is_left_alone(host):
    a, b = te.placeholder((64, 256), name="a"), te.placeholder((256,), name="b")
    out = te.compute((64, 256), lambda i, j: a[i, j] + b[j], name="T_add")
    space = generate_space(_workload(a, b, out), host, modules=["transpose-tiling"])
    assert "split" not in _kinds(space)


def test_a_transpose_is_tiled_with_the_row_tile_inside_the_other_loops(host):
    space = generate_space(_attention_keys(), host, modules=["transpose-tiling"])
    names = [str(loop.loop_var.name) for loop in _loops(space.program(space.trace)["main"])]
    assert [name[0] for name in names] == ["h", "d", "s", "d", "s"]  # rows and columns (128 > 4 vectors) split
    assert names[-2:] == ["d_1", "s_1"]  # the row tile, then the column tile innermost


def test_a_short_column_loop_stays_whole(host):
    columns = 3 * vector_width(host)
    a = te.placeholder((columns, 96), name="a")
    out = te.compute((96, columns), lambda j, i: a[i, j], name="T_transpose")
    space = generate_space(_workload(a, out), host, modules=["transpose-tiling"])
    names = [str(loop.loop_var.name) for loop in _loops(space.program(space.trace)["main"])]
    assert names == ["j_0", "j_1", "i"]  # three vectors of columns: one loop


def test_tiled_transposes_compute_the_transpose(host):
    assert_samples_correct(_attention_keys(), generate_space(_attention_keys(), host), host, samples=4)
    a = te.placeholder((2, 40, 96), name="a")
    out = te.compute((2, 96, 40), lambda n, c, w: a[n, w, c] * 2.0, name="T_scaled")
    assert_samples_correct(_workload(a, out), generate_space(_workload(a, out), host), host, samples=4)


def test_the_module_is_in_the_cpu_space():
    from probtune_cpu.defaults import DEFAULT_MODULES

    assert DEFAULT_MODULES.index(TransposeTiling.name) == DEFAULT_MODULES.index("parallel-vectorize") - 1


def _between_transposes() -> Workload:
    """A speech front end's normalization and GELU computed channels-first between a transpose and its inverse,
    with a (channels, 1) scale: once inlined, the time loop is innermost and walks every buffer across its rows."""
    x = te.placeholder((1, 200, 96), name="x")
    scale = te.placeholder((96, 1), name="scale")
    moved = te.compute((1, 96, 200), lambda n, c, t: x[n, t, c], name="T_transpose")
    scaled = te.compute((1, 96, 200), lambda n, c, t: moved[n, c, t] * scale[c, 0], name="T_multiply")
    out = te.compute((1, 200, 96), lambda n, t, c: scaled[n, c, t] + 1.0, name="T_transpose1")
    return _workload(x, scale, out)


def test_a_nest_merely_out_of_order_gets_its_row_loop_innermost(host):
    workload = _between_transposes()
    space = generate_space(workload, host, modules=["auto-inline", "transpose-tiling"])
    assert "sample_perfect_tile" not in _kinds(space)
    names = [str(loop.loop_var.name) for loop in _loops(space.program(space.trace)["main"])]
    assert names == ["n", "t", "c"]  # inlined, the nest was (n, c, t)
    assert_samples_correct(workload, generate_space(workload, host), host, samples=3)
