"""Compile a model from each database (trials=0), export, then time onnxruntime and each in turn (bench/isolated.py)."""
import sys, json, tempfile
from pathlib import Path
sys.path.insert(0, 'bench')
import numpy as np
from isolated import Engine, Worker, median_ratio, time_in_turn
import probtune
def main():
    onnxf = Path(sys.argv[1]); dbs = sys.argv[2:]
    m = probtune.load_model(onnxf)
    shapes = {s.name: tuple(s.shape) for s in m.inputs}
    tmp = Path(tempfile.mkdtemp())
    workers = {"onnxruntime": Worker(Engine("onnxruntime", onnxf, shapes, 2))}
    for spec in dbs:
        db, _, mode = spec.partition(':')
        r = probtune.tune_model(m, 'host', 0, database=db, seed=0, cache_flush=(mode != 'warm'))
        c = r.compile(check=True, num_threads=2)
        print(db, 'est ms', r.estimated_latency*1e3, c.check)
        lib = c.export_library(tmp / (Path(db).stem + '.so'))
        workers[Path(db).stem] = Worker(Engine("tvm", onnxf, shapes, 2, lib))
    inputs = m.random_inputs(0)
    samples = time_in_turn(workers, list(inputs), rounds=7, budget_s=1.0)
    for name, s in samples.items():
        print(name, 'ms', [round(x*1e3, 3) for x in s], 'ratio ort/it', round(median_ratio(samples['onnxruntime'], s), 3))
    for w in workers.values(): w.close()

if __name__ == '__main__':
    main()
