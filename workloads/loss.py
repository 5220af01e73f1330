"""The training loss: token-mean cross-entropy of the logits, as `kernels.loss` says it runs.

- `unfused-fp32` (the workloads at 86a4f47, torchtitan): the logits are upcast to float32 and
  `F.cross_entropy` runs log-softmax and NLL as separate kernels that keep float32 copies of
  the [tokens, vocab] matrix; with tp > 1, `vocab_parallel_cross_entropy` (Megatron-LM's
  formulation, float32 too).
- `loss-parallel` (torchtitan): the same `F.cross_entropy(logits.float(), ...)`; with tp > 1
  the logits are a vocab-sharded DTensor and torch's `loss_parallel()` context runs it
  (`loss_parallel_cross_entropy`; torch/distributed/tensor/parallel/loss.py): its own
  log-softmax (upcast, max, shift, exp, sum, log: float32 temporaries of the local logits'
  size) and one backward pass for NLL and log-softmax together, which holds the saved
  log-probabilities, a zeros-with-minus-one scatter, their exp and the sum at once. The
  backward must run in the context too (`loss_context`). At tp = 1 it is `unfused-fp32`.
- `fused`: one kernel forward and one backward over the low-precision logits, as flash-attn's
  `CrossEntropyLoss` runs (llm-foundry's `loss_fn: fused_crossentropy`): the forward keeps
  the logits and a float32 logsumexp per token, the backward writes a new gradient in the
  logits' dtype (flash-attn's `inplace_backward=False`, as llm-foundry builds it).
- `fused-inplace`: the same kernels, but the backward writes the gradient over the logits
  (llm.c's `fused_classifier`; Transformer Engine's `parallel_cross_entropy`, Megatron's
  `--cross-entropy-fusion-impl te`), so backward allocates nothing of [tokens, vocab].

The fused kernels are the custom ops `prism::cross_entropy` (per token: logsumexp over this
rank's vocabulary columns and the label's logit where this rank holds it, float32) and
`prism::cross_entropy_backward` / `prism::cross_entropy_backward_` (softmax minus one-hot,
times the loss gradient). Their CPU kernels are the reference math, their CUDA kernels the same
math compiled into fused kernels (`workloads.models.cuda_kernels`); their fake kernels
allocate only the outputs, so capture sees one memory-bound op each way and no float32 copy.
With tp > 1 the vocabulary-parallel combination stays three all-reduces over the tp group
(max and sum of exp of the partial logsumexps, the label's logit), as Megatron's.
Padded vocabulary columns (`kernels.vocab_multiple`) take part in the softmax, as in Megatron
(llm.c's classifier skips them: a difference of values, not of the kernels or their memory).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel

from workloads.models.cuda_kernels import register_compiled_cuda_kernel

FUSED_LOSSES = ("fused", "fused-inplace")


def _label_columns(labels: Tensor, vocab_start: int, columns: int) -> tuple[Tensor, Tensor]:
    """(column of each label in this shard, clamped into range; whether this shard holds it)."""
    local = labels - vocab_start
    inside = (local >= 0) & (local < columns)
    return local.clamp(0, columns - 1), inside


def _stats(logits: Tensor, labels: Tensor, vocab_start: int) -> tuple[Tensor, Tensor]:
    x = logits.float()
    columns, inside = _label_columns(labels, vocab_start, logits.shape[-1])
    target = x.gather(-1, columns.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
    return torch.logsumexp(x, dim=-1), target


@torch.library.custom_op("prism::cross_entropy", mutates_args=())
def cross_entropy_stats(logits: Tensor, labels: Tensor, vocab_start: int) -> tuple[Tensor, Tensor]:
    """logits [N, V_local], labels [N] -> (logsumexp [N], label logit or 0 [N]), float32."""
    return _stats(logits, labels, vocab_start)


@cross_entropy_stats.register_fake
def _(logits, labels, vocab_start):
    return (
        logits.new_empty(labels.shape, dtype=torch.float32),
        logits.new_empty(labels.shape, dtype=torch.float32),
    )


def _gradient(grad_loss: Tensor, logits: Tensor, labels: Tensor, lse: Tensor, vocab_start: int):
    """(softmax - one_hot(label)) * grad_loss, float32 [N, V_local]. The one-hot is a compare
    against the column index, not a scatter, so that compiled (CUDA) it is one pointwise kernel
    with no float32 [N, V_local] buffer."""
    columns, inside = _label_columns(labels, vocab_start, logits.shape[-1])
    vocab_columns = torch.arange(logits.shape[-1], device=logits.device)
    one_hot = (vocab_columns == columns.unsqueeze(-1)) & inside.unsqueeze(-1)
    softmax = (logits.float() - lse.unsqueeze(-1)).exp()
    return (softmax - one_hot.float()) * grad_loss.unsqueeze(-1)


def _gradient_in_dtype(grad_loss, logits, labels, lse, vocab_start: int) -> Tensor:
    return _gradient(grad_loss, logits, labels, lse, vocab_start).to(logits.dtype)


def _gradient_over_logits(grad_loss, logits, labels, lse, vocab_start: int) -> None:
    logits.copy_(_gradient(grad_loss, logits, labels, lse, vocab_start))


@torch.library.custom_op("prism::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(
    grad_loss: Tensor, logits: Tensor, labels: Tensor, lse: Tensor, vocab_start: int
) -> Tensor:
    return _gradient_in_dtype(grad_loss, logits, labels, lse, vocab_start)


@cross_entropy_backward.register_fake
def _(grad_loss, logits, labels, lse, vocab_start):
    return torch.empty_like(logits)


@torch.library.custom_op("prism::cross_entropy_backward_", mutates_args=("logits",))
def cross_entropy_backward_(
    grad_loss: Tensor, logits: Tensor, labels: Tensor, lse: Tensor, vocab_start: int
) -> None:
    _gradient_over_logits(grad_loss, logits, labels, lse, vocab_start)


@cross_entropy_backward_.register_fake
def _(grad_loss, logits, labels, lse, vocab_start):
    return None


register_compiled_cuda_kernel(cross_entropy_stats, _stats)
register_compiled_cuda_kernel(cross_entropy_backward, _gradient_in_dtype)
register_compiled_cuda_kernel(cross_entropy_backward_, _gradient_over_logits)


class _FusedCrossEntropy(torch.autograd.Function):
    """Per-token loss of (possibly vocab-sharded) logits [N, V_local] with the fused kernels."""

    @staticmethod
    def forward(ctx, logits, labels, group, vocab_start, inplace):
        lse, target = cross_entropy_stats(logits, labels, vocab_start)
        if group is not None:
            # logsumexp over the shards: max, then sum of exp relative to it
            row_max = lse.clone()
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
            sum_exp = (lse - row_max).exp()
            dist.all_reduce(sum_exp, group=group)
            lse = row_max + sum_exp.log()
            dist.all_reduce(target, group=group)
        ctx.save_for_backward(logits, labels, lse)
        ctx.vocab_start, ctx.inplace = vocab_start, inplace
        return lse - target

    @staticmethod
    def backward(ctx, grad_loss):
        logits, labels, lse = ctx.saved_tensors
        if ctx.inplace:
            cross_entropy_backward_(grad_loss, logits, labels, lse, ctx.vocab_start)
            return logits, None, None, None, None
        grad = cross_entropy_backward(grad_loss, logits, labels, lse, ctx.vocab_start)
        return grad, None, None, None, None


def _vocab_start(group, vocab: int) -> int:
    """First vocabulary row of this rank's shard (torch.chunk's split, as the output layer's)."""
    if group is None:
        return 0
    return dist.get_rank(group) * -(-vocab // dist.get_world_size(group))


def fused_cross_entropy(logits: Tensor, labels: Tensor, group, vocab: int, *, inplace: bool):
    """Mean cross-entropy with the fused kernels; `group`: the tp group of vocab-sharded
    logits (None: whole logits)."""
    per_token = _FusedCrossEntropy.apply(
        logits.flatten(0, -2), labels.flatten(), group, _vocab_start(group, vocab), inplace
    )
    return per_token.mean()


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss from vocab-sharded logits [..., V/tp] (Megatron-LM's formulation)."""

    @staticmethod
    def forward(ctx, logits, labels, group, vocab):
        ctx.input_dtype = logits.dtype
        logits = logits.float()
        local_vocab = logits.shape[-1]
        start = _vocab_start(group, vocab)
        row_max = logits.amax(dim=-1)
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - row_max.unsqueeze(-1)
        outside = (labels < start) | (labels >= start + local_vocab)
        local_labels = (labels - start).masked_fill(outside, 0)
        target = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1)
        target = target.masked_fill(outside, 0.0)
        dist.all_reduce(target, group=group)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_labels, outside)
        return sum_exp.log() - target

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_labels, outside = ctx.saved_tensors
        grad = softmax.clone()
        hit = (~outside).to(grad.dtype).unsqueeze(-1)
        grad.scatter_add_(-1, local_labels.unsqueeze(-1), -hit)
        grad = grad * grad_loss.unsqueeze(-1)
        return grad.to(ctx.input_dtype), None, None, None


def vocab_parallel_cross_entropy(logits, labels, group, vocab: int) -> Tensor:
    """Mean cross-entropy of vocab-sharded logits (rank r holds torch.chunk's r-th vocab slice)."""
    per_token = _VocabParallelCrossEntropy.apply(logits, labels, group, vocab)
    return per_token.mean()


def loss_parallel_cross_entropy(logits: Tensor, labels: Tensor, tp_mesh) -> Tensor:
    """Mean cross-entropy of vocab-sharded logits [..., V/tp] as torchtitan runs it: the local
    logits wrapped as a DTensor sharded on the vocabulary over `tp_mesh`, `F.cross_entropy` of
    its float32 upcast; returns the local (replicated) loss. Runs inside `loss_context`, with
    the backward (torch's context does not nest: an inner one would unregister the backward
    handlers on exit)."""
    if not _in_loss_parallel:
        raise RuntimeError(
            "kernels.loss = 'loss-parallel' with tp > 1 runs its forward and backward inside "
            "workloads.loss.loss_context (torch's loss_parallel())"
        )
    sharded = DTensor.from_local(logits, tp_mesh, [Shard(-1)], run_check=False)
    return F.cross_entropy(sharded.flatten(0, -2).float(), labels.flatten()).to_local()


_in_loss_parallel = False


@contextlib.contextmanager
def loss_context(kind: str, tp_mesh):
    """The context a micro-batch's forward and backward run in: torch's `loss_parallel()`
    for `loss-parallel` with vocab-sharded logits (its backward handlers are registered
    only inside it), else none."""
    global _in_loss_parallel
    if kind != "loss-parallel" or tp_mesh is None:
        yield
        return
    with loss_parallel():
        _in_loss_parallel = True
        try:
            yield
        finally:
            _in_loss_parallel = False


def cross_entropy(kind: str, logits: Tensor, labels: Tensor, tp_mesh, vocab: int) -> Tensor:
    """Token-mean cross-entropy as `kernels.loss` = `kind` runs it (module docstring);
    `vocab`: rows of the output layer (padded), `tp_mesh`: the 1-D DeviceMesh of the tp group
    the logits are vocab-sharded over, or None."""
    if kind == "loss-parallel" and tp_mesh is not None:
        return loss_parallel_cross_entropy(logits, labels, tp_mesh)
    group = tp_mesh.get_group() if tp_mesh is not None else None
    if kind in FUSED_LOSSES:
        return fused_cross_entropy(logits, labels, group, vocab, inplace=kind == "fused-inplace")
    if group is None:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    return vocab_parallel_cross_entropy(logits, labels, group, vocab)
