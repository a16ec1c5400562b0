"""MnasNet per layer kind: probtune's task times inside its compiled model (the Relax VM's instrument hook) against onnxruntime's per-node profile, in one process.

Usage: .venv/bin/python bench/results/mnasnet_per_layer.py bench/zoo/mnasnet1_0.onnx DATABASE. The onnxruntime node names are matched to MnasNet's blocks (torchvision's export), so this reads MnasNet only.
"""
import sys, re, time, collections, json
import numpy as np, probtune, tvm, onnxruntime as ort
onnxf, db = sys.argv[1], sys.argv[2]
m = probtune.load_model(onnxf)
r = probtune.tune_model(m, 'host', 0, database=db, seed=0)
kind = {}
for row in r.tasks:
    orig = [re.sub(r'T\.int64\((\d+)\)', r'\1', b) for b in re.findall(r'T\.Buffer\(\((.*?)\), "float32"\)', r.programs[row.name]['main'].script())]
    w = orig[1] if len(orig) > 1 else ''
    kind[row.name] = ('1x1' if w.startswith('1, 1,') else ('stem' if w.endswith(', 3, 32') else 'dw')) if 'conv2d' in row.name else ('gemm' if 'matmul' in row.name else 'other')
c = r.compile(check=False, num_threads=2)
vm = c._vm
times = collections.defaultdict(float); start = {}
def instr(func, name, before, ret, *args):
    if before: start[name] = time.perf_counter()
    else: times[name] += time.perf_counter() - start[name]; ncalls[name] += 1
    return 0
x = [np.random.rand(*s.shape).astype(s.dtype) for s in m.inputs]
def run(n):
    for _ in range(n): c(*x)
from probtune.model.threads import PoolThread
pool = PoolThread(2)
pool.run(run, 20)
t0 = time.perf_counter(); pool.run(run, 50); print('probtune uninstrumented ms', (time.perf_counter() - t0) / 50 * 1e3)
ncalls = collections.Counter()
vm.set_instrument(instr)
N = 50
t0 = time.perf_counter(); pool.run(run, N); total = (time.perf_counter() - t0) / N * 1e3
g = collections.Counter(); other = collections.Counter()
for k, v in times.items():
    kk = next((kind[t] for t in kind if k == t or k.endswith(t)), None)
    if kk is None: other[k] += v / N * 1e3; kk = 'vm:' + k.split('.')[-1][:20]
    g[kk] += v / N * 1e3
print('probtune in-model per call ms', round(total, 3), 'calls per run', sum(ncalls.values()) / N, 'task calls', sum(v for k, v in ncalls.items() if 'fused' in k or k in kind) / N)
for k, v in sorted(g.items(), key=lambda kv: -kv[1]): print(f'  {k:28s} {v:7.3f}')
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.enable_profiling = True; so.profile_file_prefix = '/tmp/s53/ortprof'
s = ort.InferenceSession(onnxf, so, providers=['CPUExecutionProvider'])
feed = {i.name: xi for i, xi in zip(s.get_inputs(), x)}
for _ in range(20): s.run(None, feed)
so2 = ort.SessionOptions(); so2.intra_op_num_threads = 2; s2 = ort.InferenceSession(onnxf, so2, providers=['CPUExecutionProvider'])
for _ in range(20): s2.run(None, feed)
t0 = time.perf_counter()
for _ in range(50): s2.run(None, feed)
print('onnxruntime unprofiled ms', (time.perf_counter() - t0) / 50 * 1e3)
t0 = time.perf_counter()
for _ in range(N): s.run(None, feed)
ototal = (time.perf_counter() - t0) / N * 1e3
ev = json.load(open(s.end_profiling()))
og = collections.Counter()
for e in ev:
    if e.get('cat') == 'Node' and e['name'].endswith('_kernel_time'):
        name, op = e['name'], e['args'].get('op_name')
        k = op
        if op == 'Conv':
            if re.search(r'\d\.\d/layers/layers\.5/|nner/layers/layers\.5/|nner/layers/layers\.3/', name): k = 'dw'
            elif 'nner/layers/layers.0/' in name or 'nner/layers/layers.2/' in name: k = 'stem'
            else: k = '1x1'
        elif op == 'Gemm': k = 'gemm'
        og[k] += e['dur'] / 1e3
cnt = len([e for e in ev if e.get('cat') == 'Node' and e['name'].endswith('_kernel_time')])
print('onnxruntime per call ms (profiled run)', round(ototal, 3), 'profile events', cnt)
runs = 70
for k, v in sorted(og.items(), key=lambda kv: -kv[1]): print(f'  {k:28s} {v / runs:7.3f}')
