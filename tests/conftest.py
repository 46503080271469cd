import os
import threading

import pytest
import torch

if not torch.cuda.is_available():
    # the fused decoder's Triton kernels run under Triton's CPU interpreter, which must be on
    # before anything imports triton (torch.compile does): triton.language's own @jit helpers are
    # made when triton is imported, and the interpreter cannot call compiled ones.
    os.environ.setdefault("TRITON_INTERPRET", "1")


from fastgen_lib.interpret import fix_interpreter  # noqa: E402  (after TRITON_INTERPRET is set)

fix_interpreter()  # Triton's interpreter on the fused kernels; the fused decoder calls it too


def pytest_collection_modifyitems(config, items):
    # GPU tests run on the H200 through the device tool; on a machine without CUDA they skip cleanly.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_threads():
    """`run(model, batches, rounds, **kw)`: every batch in a thread of its own, `rounds`
    `fg.generate` calls each, all started together -> ({thread: [outputs]}, [exceptions])."""
    import fastgen_lib as fg

    def run(model, batches, rounds, **kw):
        got, errors = {i: [] for i in range(len(batches))}, []
        start = threading.Barrier(len(batches))

        def work(i):
            try:
                start.wait()
                for _ in range(rounds):
                    got[i].append(fg.generate(model, *batches[i], **kw))
            except Exception as e:  # noqa: BLE001 (the test reports it)
                errors.append(e)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return got, errors
    return run
