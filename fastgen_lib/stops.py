"""Stop drivers: when the host learns that every row has finished (`registry.py` pairs each with a
step backend). A driver takes a step that has run the prompt, launches the other steps, and returns
how many new tokens to keep. Each is declared as a `Driver`: its flag slots (and so graphs) and
what it needs of a step, which `decoders.decode` checks against the step's `offers`. Ch. 5-7.
"""
from dataclasses import dataclass
from typing import Callable

import torch

# What a step backend offers a driver (`offers(gen)` on the backend) and a driver may need:
REPLAYS = "a step that allocates nothing while it runs (one CUDA graph replay)"
LOOP_BODY = ("a step whose capture allocates nothing, so a CUDA graph's WHILE node holds it "
             "(the fused step under greedy decoding: without do_sample)")


@dataclass(frozen=True)
class Driver:
    """A stop driver: `run(step, max_new_tokens, streamer)`, the flag slots it uses, what it
    needs of a step on a CUDA GPU, whether it runs only there, and whether it can stream."""
    run: Callable
    slots: tuple = (0,)
    needs: frozenset = frozenset()
    cuda: bool = False
    streams: bool = True

    def __call__(self, step, max_new_tokens, streamer=None):
        return self.run(step, max_new_tokens, streamer)


def every_step(step, max_new_tokens, streamer=None):
    """Ch. 5: after every step the host reads "all finished" (`.item()`: ch. 6's hidden
    sync). A `streamer` gets each step's tokens [B] here too, while the GPU waits for
    the next launch."""
    for i in range(1, max_new_tokens):
        if streamer is not None:
            streamer.put(step.out[:, step.t + i - 1].cpu())
        # host waits for the GPU here: the GPU idles until the next launch
        if step.done[0].item():
            return i
        step(0)
    if streamer is not None:
        streamer.put(step.out[:, step.t + max_new_tokens - 1].cpu())
    return max_new_tokens


every_step = Driver(every_step)


class Flags:
    """Pinned host copies of a step's two "all finished" flags (and, for a streamer, its
    tokens): each copied non-blocking, marked with an event, and read once that event
    has passed."""

    def __init__(self, device, batch=0):
        self.cuda = device.type == "cuda"
        self.host = torch.zeros(2, dtype=torch.bool, pin_memory=self.cuda)
        self.tokens = torch.zeros(2, batch, dtype=torch.long,
                                  pin_memory=self.cuda and batch > 0)
        self.copied = [torch.cuda.Event(), torch.cuda.Event()] if self.cuda else None

    def copy(self, slot, done, tokens=None):
        """Queue the copy of `done` (and `tokens`) into pinned host memory on the
        current stream; mark it with an event."""
        self.host[slot].copy_(done, non_blocking=True)
        if tokens is not None:
            self.tokens[slot].copy_(tokens, non_blocking=True)
        if self.cuda:
            self.copied[slot].record()

    def read(self, slot):
        if self.cuda:
            # host waits for the GPU here: until that flag has landed
            self.copied[slot].synchronize()
        return bool(self.host[slot])


def _streamed(step, i, streamer):
    """Step i's tokens [B] for the flag copy, if a streamer wants them."""
    return None if streamer is None else step.out[:, step.t + i]


def _stream(flags, slot, streamer):
    if streamer is not None:  # after `read(slot)`: the tokens have landed too
        streamer.put(flags.tokens[slot].clone())


def deferred(step, max_new_tokens, streamer=None):
    """Ch. 7, one stream: launch step i first, then read step i-1's flag, copied non-blocking into pinned
    memory. The GPU always has the next step queued; when the flag says stop, step i is thrown away.
    Steps alternate between the two flag slots (and graphs), so a flag is never overwritten unread.
    A `streamer` gets step i-1's tokens with its flag, while step i runs."""
    flags = Flags(step.out.device, step.out.shape[0] if streamer is not None else 0)
    flags.copy(0, step.done[0], _streamed(step, 0, streamer))  # the prompt's token's flag
    for i in range(1, max_new_tokens):
        slot = i % 2
        step(slot)
        flags.copy(slot, step.done[slot], _streamed(step, i, streamer))
        finished = flags.read(1 - slot)  # step i-1's flag; the GPU is busy with step i meanwhile
        _stream(flags, 1 - slot, streamer)
        if finished:
            return i
    if streamer is not None:
        flags.read((max_new_tokens - 1) % 2)
        _stream(flags, (max_new_tokens - 1) % 2, streamer)
    return max_new_tokens


deferred = Driver(deferred, slots=(0, 1))


def interleaved(step, max_new_tokens, streamer=None):
    """Ch. 7, the final driver: `deferred` on two CUDA streams in ping-pong. Step i runs on stream i%2
    with its own graph and flag slot; the next step waits (on the GPU) only for step i's compute, so the
    flag copy of step i overlaps step i+1 instead of sitting between them. On a CPU there are no streams
    and this is `deferred`. Needs a step that allocates nothing (`REPLAYS`)."""
    if not step.out.is_cuda:
        return deferred(step, max_new_tokens, streamer)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    computed = [torch.cuda.Event(), torch.cuda.Event()]  # step i's compute has finished
    flags = Flags(step.out.device, step.out.shape[0] if streamer is not None else 0)
    computed[0].record()  # the prompt's token is step 0, on the caller's stream
    flags.copy(0, step.done[0], _streamed(step, 0, streamer))
    n = max_new_tokens
    for i in range(1, max_new_tokens):
        slot = i % 2
        s = streams[slot]
        s.wait_event(computed[1 - slot])  # GPU-side wait for step i-1's token and cache; host goes on
        with torch.cuda.stream(s):
            step(slot)
            computed[slot].record()
            flags.copy(slot, step.done[slot], _streamed(step, i, streamer))
        finished = flags.read(1 - slot)  # step i-1's flag: host waits for the GPU here, one step behind
        _stream(flags, 1 - slot, streamer)
        if finished:
            n = i
            break
    else:
        if streamer is not None:
            flags.read((n - 1) % 2)
            _stream(flags, (n - 1) % 2, streamer)
    for s in streams:  # the caller's stream reads `out` after both streams' work; no host wait
        torch.cuda.current_stream().wait_stream(s)
    return n


interleaved = Driver(interleaved, slots=(0, 1), needs=frozenset({REPLAYS}))
