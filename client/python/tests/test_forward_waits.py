"""CudaPath.hook_forward's hooks, on the CPU with a client that records
what it is asked (the GPU machine's test_cuda.py trains with them for real):
which submodules wait, for how many matrices, how often, and what is
refused."""

import pytest
import torch

import muonps._cuda
from muonps._cuda import CudaPath


class RecordingClient:
    """What CudaPath calls on a client, recorded."""

    def __init__(self):
        self.waits = []  # matrices of each wait_for_parameters
        self.steps = []  # forward_waits of each step

    def lend_cuda(self, name, grad, param, dtype):
        pass

    def set_group(self, index, names):
        pass

    def wait_for_parameters(self, stream, matrices):
        self.waits.append(matrices)

    def allocate_gradient(self, name):
        return name  # the fixture's _over makes the buffer

    def place_gradient(self, name, grad):
        pass

    def step(self, step_id, values, stream=0, async_=False,
             forward_waits=False):
        self.steps.append(forward_waits)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4, bias=False)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Linear(4, 4, bias=False) for _ in range(3))
        self.last = torch.nn.Linear(4, 2, bias=False)

    def forward(self, x):
        x = self.first(x)
        for block in self.blocks:
            x = block(x)
        return self.last(x)


@pytest.fixture
def path(monkeypatch):
    """A CudaPath over Net's five matrices, lent in Net's order, whose
    stream calls need no GPU."""
    class Stream:
        cuda_stream = 0
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None:
                        Stream())
    monkeypatch.setattr(muonps._cuda, "_over",
                        lambda memory, like: torch.zeros_like(like))
    net = Net()
    client = RecordingClient()
    matrices = [(n, p, 0) for n, p in net.named_parameters()]
    cuda = CudaPath(client, torch.device("cpu"), matrices, [],
                    [{"params": []}], {})
    return net, client, cuda


def test_each_layer_waits_for_the_matrices_lent_up_to_its_own(path):
    net, client, cuda = path
    cuda.hook_forward(net)
    # One a layer, and state_dict's where torch has the hook (2.0 on).
    state_dict_hook = hasattr(net, "register_state_dict_pre_hook")
    assert len(cuda.forward_hooks) == 5 + state_dict_hook
    net(torch.randn(2, 4))
    assert client.waits == [1, 2, 3, 4, 5]
    # A second forward under the same step waits for nothing more.
    net(torch.randn(2, 4))
    assert client.waits == [1, 2, 3, 4, 5]
    # The step's own wait for the gradients (0) is implied by the layers'.
    client.waits.clear()
    cuda.step(0, [(0.02, 0.1, 1e-3, 0.0)])
    assert client.steps == [True]
    assert client.waits == []
    # After it, zero_grad's wait for its gradients comes first, then the
    # layers'.
    cuda.zero_grad()
    net(torch.randn(2, 4))
    assert client.waits == [0, 1, 2, 3, 4, 5]
    # state_dict reads every parameter: the whole step.
    net.state_dict()
    if state_dict_hook:
        assert client.waits[-1] == -1
    cuda.close()
    assert not cuda.forward_hooks


def test_a_model_missing_a_lent_matrix_is_refused_naming_it(path):
    net, client, cuda = path
    with pytest.raises(ValueError, match=r"'last.weight'"):
        cuda.hook_forward(net.blocks)
    assert not cuda.forward_hooks and not cuda.forward_waits
    net(torch.randn(2, 4))
    assert client.waits == []


def test_without_hooks_the_step_waits_as_before(path):
    net, client, cuda = path
    cuda.step(0, [(0.02, 0.1, 1e-3, 0.0)])
    cuda.zero_grad()
    net(torch.randn(2, 4))
    assert client.steps == [False]
    assert client.waits == []
