"""The order in which the in-process bench runs its variants' steps: balanced for carryover.

A step is not independent of the one before it. A step that ends in a collective (the toolkit
with `step_loss: global`) hands the next one ranks that start together; a step that does not
hands it their skew, which its first collective absorbs on the rank that arrived first. The
first in-process runs rotated the variants (a b c d, b c d a, ...), which puts most variants
behind the same predecessor three times in four: `native` behind `toolkit+global-loss`, and
`toolkit` and `native-again` behind `native`. Both then read about 1% slower than `native` in
every launch (DDP 1.010 [1.004, 1.013] over 5 launches, its A/A alike), a bias of the order,
not a cost of the toolkit.

The order here walks an Eulerian circuit of the complete directed graph on the variants: each
ordered pair of distinct variants follows each other exactly once per round of n(n-1) steps,
the round's last step leads into its first, and each variant runs n-1 times a round. Repeated
rounds keep every variant behind every other one equally often (a Williams-style design that
carries across rounds too, which Latin squares of separate cycles do not).
"""

from __future__ import annotations


def carryover_balanced(count: int) -> list[int]:
    """Indices 0..count-1 in an order in which, read cyclically, every ordered pair (a, b) with
    a != b appears once as neighbours; [0] for one variant."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if count == 1:
        return [0]
    unused = {node: [other for other in range(count) if other != node] for node in range(count)}
    stack, circuit = [0], []
    while stack:  # Hierholzer's algorithm
        node = stack[-1]
        if unused[node]:
            stack.append(unused[node].pop())
        else:
            circuit.append(stack.pop())
    circuit.reverse()
    return circuit[:-1]  # the circuit returns to its start: read cyclically instead
