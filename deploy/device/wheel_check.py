# On the GPU machine, from the installed wheel (client/python/build_wheel.sh):
# muonps.Muon on CUDA with no service started by hand, against
# torch.optim.Muon over 10 steps; the library and the service's binaries
# must come from the wheel and no child may be left after close().
#   pip install --target /tmp/site dist/muonps-*.whl
#   PYTHONPATH=/tmp/site python3 deploy/device/wheel_check.py
import copy, json, os, time
import torch, muonps
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 256)).cuda()
twin = copy.deepcopy(model)
opt = muonps.Muon(model.parameters(), lr=0.02, weight_decay=0.1)
mats = [p for p in twin.parameters() if p.dim() == 2]
vecs = [p for p in twin.parameters() if p.dim() != 2]
ref = [torch.optim.Muon(mats, lr=0.02, weight_decay=0.1),
       torch.optim.AdamW(vecs, lr=0.02, weight_decay=0.01)]
worst = 0.0
g = torch.Generator(device="cuda").manual_seed(1)
for step in range(10):
    # The same gradients on both sides (an open loop, as the golden
    # trajectories: a closed loop amplifies the bf16 NS rounding of either).
    for p, q in zip(model.parameters(), twin.parameters()):
        p.grad = torch.randn(p.shape, device="cuda", generator=g)
        q.grad = p.grad.clone()
    opt.step()
    for r in ref:
        r.step()
    opt.synchronize()
    for p, q in zip(model.parameters(), twin.parameters()):
        worst = max(worst, ((p - q).norm() / q.norm()).item())
exes = [os.readlink(f"/proc/{pid}/exe") for pid in opt._service.pids]
pids = opt._service.pids
opt.close()
time.sleep(0.5)
left = [p for p in pids if os.path.exists(f"/proc/{p}") and
        "State:\tZ" not in open(f"/proc/{p}/status").read()]
print(json.dumps({"what": "wheel_zero_setup_cuda", "steps": 10,
                  "max_rel_err_vs_torch_muon": worst, "library": muonps.load_library()._name,
                  "binaries": exes, "children_left": left, "torch": torch.__version__}))
assert worst <= 5e-3 and not left
