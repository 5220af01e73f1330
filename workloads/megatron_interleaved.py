"""Megatron-LM's interleaved 1F1B: the order of forwards, backwards and transfers of vpp chunks.

`workloads.megatron_schedule` runs it for a job with `kernels.pipeline_recv = "per-transfer"`
and schedule "interleaved-1f1b"; this module holds the order alone, over a run that computes
(`forward(chunk, received)`, `backward(chunk, received, output, output_grad)`) and transfers
(`communicate`, Megatron's `_communicate`). It follows `forward_backward_pipelining_with_
interleaving` of megatron/schedules.py as the Narayanan 2021 / Korthikanti 2022 runs had it
(NVIDIA/Megatron-LM, 2022; `get_forward_backward_func` asserts that the micro-batches are a
multiple of pp):
- the rank's chunks are virtual stages rank, rank + pp, ...; "micro-batch k" of the rank
  runs chunk (k mod (pp * vpp)) // pp forward, and the chunks in reverse order backward, so
  each chunk sees its micro-batches in order;
- warm-up: (pp - rank - 1) * 2 + (vpp - 1) * pp forwards (all m * vpp when m == pp), then
  one forward and one backward per step, then the cool-down backwards;
- transfers wrap around the pipeline (rank pp - 1 sends chunk c's output to rank 0's chunk
  c + 1); the first rank receives nothing for chunk 0 and the last rank no gradient for
  the last chunk; a receive that the next forward does not need yet is posted one step
  early, as Megatron posts it, and its buffer lives until its micro-batch's backward.
"""

from __future__ import annotations


def with_interleaving(run) -> None:
    """Run every micro-batch of every chunk of `run` (a `megatron_schedule._Run`)."""
    _Interleaved(run).execute()


class _Interleaved:
    """The lists Megatron keeps per chunk and the three phases of its schedule."""

    def __init__(self, run) -> None:
        self.run = run
        self.vpp = len(run.pipe.modules)
        self.total = run.pipe.num_microbatches * self.vpp
        self.all_warmup = run.pipe.num_microbatches == run.pp
        if self.all_warmup:
            self.warmup = self.total
        else:
            warmup = (run.pp - run.rank - 1) * 2 + (self.vpp - 1) * run.pp
            self.warmup = min(warmup, self.total)
        # per chunk, oldest first: received inputs, outputs awaiting backward, output grads
        self.inputs: list[list] = [[] for _ in range(self.vpp)]
        self.outputs: list[list] = [[] for _ in range(self.vpp)]
        self.grads: list[list] = [[] for _ in range(self.vpp)]

    def chunk(self, k: int, forward: bool) -> int:
        """Megatron's get_model_chunk_id: the chunk of the rank's k-th forward (backward)."""
        chunk = (k % (self.run.pp * self.vpp)) // self.run.pp
        return chunk if forward else self.vpp - chunk - 1

    def forward(self, k: int):
        chunk = self.chunk(k, forward=True)
        if self.run.is_first(chunk) and len(self.inputs[chunk]) == len(self.outputs[chunk]):
            self.inputs[chunk].append(None)  # the first stage reads tokens
        output = self.run.forward(chunk, self.inputs[chunk][-1])
        self.outputs[chunk].append(output)
        return output

    def backward(self, k: int):
        chunk = self.chunk(k, forward=False)
        if self.run.is_last(chunk) and not self.grads[chunk]:
            self.grads[chunk].append(None)  # the loss's own gradient
        received, output = self.inputs[chunk].pop(0), self.outputs[chunk].pop(0)
        return self.run.backward(chunk, received, output, self.grads[chunk].pop(0))

    def sent(self, k: int, output):
        """What forward k sends on: nothing from the last stage (its loss)."""
        return None if self.run.is_last(self.chunk(k, forward=True)) else output

    def execute(self) -> None:
        r = self.run
        self.inputs[0].append(r.communicate(recv_prev=not r.is_first(0))[0])
        for k in range(self.warmup):
            self._warmup_step(k)
        remaining = self.total - self.warmup
        for k in range(remaining):
            self._steady_step(k, last=k == remaining - 1)
        if self.all_warmup:
            self.grads[-1].append(r.communicate(recv_next=r.rank != r.pp - 1)[1])
        for k in range(remaining, self.total):
            input_grad = self.backward(k)
            next_chunk = self.chunk(k + 1, forward=False)
            recv_next = k != self.total - 1 and not (
                r.rank == r.pp - 1 and next_chunk == self.vpp - 1
            )
            self.grads[next_chunk].append(
                r.communicate(send_prev=input_grad, recv_next=recv_next)[1]
            )

    def _warmup_step(self, k: int) -> None:
        r = self.run
        output = self.forward(k)
        next_chunk = self.chunk(k + 1, forward=True)
        recv_prev = k != self.total - 1 and not (r.rank == 0 and next_chunk == 0)
        send = self.sent(k, output)
        if k == self.warmup - 1 and not self.all_warmup:
            received, grad = r.communicate(
                send_next=send, recv_prev=recv_prev, recv_next=r.rank != r.pp - 1
            )
            self.grads[-1].append(grad)
        else:
            received = r.communicate(send_next=send, recv_prev=recv_prev)[0]
        if send is not None:
            r.deallocated(self.chunk(k, forward=True), output)
        self.inputs[next_chunk].append(received)

    def _steady_step(self, k: int, last: bool) -> None:
        r = self.run
        forward_k = k + self.warmup
        output = self.forward(forward_k)
        input_grad = self.backward(k)
        send = self.sent(forward_k, output)
        # the first rank is pp - 1 forwards ahead of the last: its next input comes from the
        # chunk the last rank ran pp - 1 steps ago, and none after the last chunk
        if r.rank == 0:
            next_forward = self.chunk(forward_k - (r.pp - 1), forward=True)
            recv_prev = next_forward != self.vpp - 1
            next_forward += 1
        else:
            next_forward = self.chunk(forward_k + 1, forward=True)
            recv_prev = True
        # likewise backwards: the last rank is pp - 1 backwards ahead of the first
        if r.rank == r.pp - 1:
            next_backward = self.chunk(k - (r.pp - 1), forward=False)
            recv_next = next_backward != 0
            next_backward -= 1
        else:
            next_backward = self.chunk(k + 1, forward=False)
            recv_next = True
        recv_prev = recv_prev and not last  # received one ahead already
        received, grad = r.communicate(
            send_next=send, send_prev=input_grad, recv_prev=recv_prev, recv_next=recv_next
        )
        if send is not None:
            r.deallocated(self.chunk(forward_k, forward=True), output)
        if recv_prev:
            self.inputs[next_forward].append(received)
        if recv_next:
            self.grads[next_backward].append(grad)
