"""Quickstart: a small MLP on the digits data, on whichever engine the spec names."""

import torch
from torch.nn.functional import cross_entropy

import toolkit
from toolkit.datasets import digits


def sums(outputs, targets):  # evaluation adds these over micro-batches and ranks
    return {
        "loss_sum": cross_entropy(outputs, targets, reduction="sum"),
        "correct": (outputs.argmax(dim=1) == targets).sum(),
        "count": len(targets),
    }


spec = toolkit.load_spec()  # the spec this script was launched with
run = toolkit.init(spec)  # detects the launcher, starts the engine
torch.manual_seed(spec.seed)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
run.prepare(model)  # wraps it; builds the optimizer from the spec
data = digits()  # scikit-learn's 8x8 digits, shipped offline
for micro_batches in run.steps(run.loader((data.x_train, data.y_train)), epochs=8):
    run.train_step(micro_batches, cross_entropy)
held_out = run.evaluate(run.loader((data.x_test, data.y_test), shuffle=False), metric_fn=sums)
if run.is_main:
    print(f"held-out loss {held_out.loss:.3f}, accuracy {held_out.accuracy:.3f}")
run.shutdown()
