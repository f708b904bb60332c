"""Which LoRA adapters are resident: `--max-loras` slots, filled on demand, least recently used out.

An engine started with `--lora-modules` holds every adapter's weights in host memory and runs a
step with at most `num_slots` different adapters, each in a slot of the device (vLLM's
`max_loras`). A sequence takes its adapter's slot when the scheduler admits it and gives it back
when it stops running (finished, preempted, aborted). A slot no running sequence uses keeps its
adapter until another needs the room: then the least recently used such slot is refilled, which
costs a load (a copy of the adapter's weights in, `loaded`). A sequence whose adapter is not
resident waits while every slot is in use. The torch runner copies the weights when a step's
work names an adapter its slot does not hold yet; the sim runner charges the cost model's
`adapter_load_s` for each such copy (engine/runners/sim.py `adapter_loads`), and the simulator
prices its steps through the same runner. `resident()` and `num_slots` are the load record's
`adapters` and `adapter_slots`, which the router's cost model reads (router/decision/scoring/kv_cost.py).
"""

from __future__ import annotations


class AdapterSlots:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"--max-loras must be at least 1, got {num_slots}")
        self.num_slots = num_slots
        self.names: list[str | None] = [None] * num_slots
        self.users = [0] * num_slots  # running sequences in each slot
        self.order = list(range(num_slots))  # least recently used first
        self.loads = 0  # slots (re)filled since start

    def slot_of(self, name: str) -> int:
        """The slot holding `name`, or -1."""
        try:
            return self.names.index(name)
        except ValueError:
            return -1

    def can_take(self, name: str) -> bool:
        return name in self.names or 0 in self.users

    def take(self, name: str) -> tuple[int, bool]:
        """A slot for one more sequence of `name` and whether it has to be loaded; `can_take` first."""
        slot = self.slot_of(name)
        loaded = slot < 0
        if loaded:
            slot = next(s for s in self.order if self.users[s] == 0)  # the least recently used free slot
            self.names[slot] = name
            self.loads += 1
        self.users[slot] += 1
        self._touch(slot)
        return slot, loaded

    def release(self, slot: int) -> None:
        self.users[slot] -= 1
        self._touch(slot)

    def _touch(self, slot: int) -> None:
        self.order.remove(slot)
        self.order.append(slot)

    def resident(self) -> tuple[str, ...]:
        """The adapters in a slot now, most recently used last."""
        return tuple(name for s in self.order if (name := self.names[s]) is not None)
