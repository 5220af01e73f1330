"""Hand-written recorder rows for the torch.compile tests: compute rows with storage ids,
allocations and frees, in one compiled block (`BLOCK`), as the op recorder writes them."""

from emulator.capture.trace import ALLOC, COMPUTE, FREE, OpEvent

BLOCK = "Net.layers.0"
N, D = 8, 16  # rows and columns of the hand-written tensors (float32: 512 bytes each)


class Rows:
    """Hand-written recorder rows: compute rows with storage ids, allocations, frees."""

    def __init__(self):
        self.events, self.seq = [], 0

    def _next(self):
        self.seq += 1
        return self.seq

    def op(self, name, reads, writes, module=BLOCK, out_shape=(N, D), in_shapes=None, phase=0):
        in_shapes = in_shapes or [(N, D)] * len(reads)
        tensors = tuple((shape, "float32", False) for shape in in_shapes) + tuple(
            (out_shape, "float32", True) for _ in writes
        )
        self.events.append(
            OpEvent(
                self._next(), COMPUTE, name, f"aten.{name}", 0, module, phase, 0,
                read_bytes=4 * N * D * len(reads), write_bytes=4 * N * D * len(writes),
                tensors=tensors, flows=(*reads, *writes),
            )
        )  # fmt: skip
        return self.seq

    def new(self, name, reads, out, **op_args):
        """An op writing a storage allocated for it."""
        self.alloc(out)
        return self.op(name, reads, (out,), **op_args)

    def alloc(self, uid, size=4 * N * D):
        self.events.append(
            OpEvent(self._next(), ALLOC, "", "", 0, BLOCK, 0, 0, size_bytes=size, storage=uid)
        )

    def free(self, uid, size=4 * N * D):
        self.events.append(
            OpEvent(self._next(), FREE, "", "", 0, BLOCK, 0, 0, size_bytes=size, storage=uid)
        )

    def chain(self, start_uid, module=BLOCK):
        """mm -> mul -> add -> relu -> mm, the temporaries freed as eager Python frees them."""
        x, w, y, t1, t2, z, o = range(start_uid, start_uid + 7)
        self.alloc(y)
        self.op("mm", (x, w), (y,), module)
        self.alloc(t1)
        self.op("mul", (y,), (t1,), module)
        self.alloc(t2)
        self.op("add", (t1,), (t2,), module)
        self.free(t1)
        self.alloc(z)
        self.op("relu", (t2,), (z,), module)
        self.free(t2)
        self.alloc(o)
        self.op("mm", (z, w), (o,), module)


def as_classes(events, classes=None):
    """`events` with each compute row's name set to its cost class: `classes[name]`, else
    "elementwise" (a GEMM, "mm", keeps its name)."""
    classes = {"mm": "mm", **(classes or {})}
    return [
        e._replace(name=classes.get(e.name, "elementwise")) if e.kind == COMPUTE else e
        for e in events
    ]
