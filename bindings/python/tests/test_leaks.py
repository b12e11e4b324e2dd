"""No leaks: native handles all closed, the library's allocations balanced (through the
allocator hooks), and Python memory flat under tracemalloc over repeated use."""
import gc
import tracemalloc

import dsinfer

PROMPT = "Once upon a time"


def one_round(model, stop_stream_early=False):
    prompt = model.tokenize(PROMPT, add_bos=True)
    with model.session() as s, dsinfer.Sampler(context=model.context, temperature=0.8,
                                               seed=7) as smp:
        s.generate(smp, prompt, max_tokens=6, stop=["zz"], on_token=lambda t, x: None)
        it = s.stream(smp, prompt, max_tokens=6, stop=["zz"])
        if stop_stream_early:
            next(it)  # abandoned: closed by the garbage collector
        else:
            list(it)
        s.logits()
        smp.probs()
        model.detokenize(s.tokens())
        model.chat_tokens([{"role": "user", "content": "hi"}])
        with model.detokenizer() as d:
            d.feed(prompt[-1])
    del it


def test_abandoned_stream_closes_without_gc(model):
    """An abandoned stream is freed by reference counting alone (no cycle): its
    detokenizer closes at once."""
    import gc as _gc
    before = dsinfer.open_handles().get("detokenizer", 0)
    _gc.disable()
    try:
        with model.session() as s, dsinfer.Sampler(temperature=0) as smp:
            it = s.stream(smp, model.tokenize(PROMPT, add_bos=True), max_tokens=8)
            next(it)
            assert dsinfer.open_handles().get("detokenizer", 0) == before + 1
            del it
            assert dsinfer.open_handles().get("detokenizer", 0) == before
    finally:
        _gc.enable()


def test_handles_all_closed(default_model_path):
    before = dsinfer.open_handles()
    with dsinfer.Context(n_threads=2) as ctx:
        with ctx.load_model(default_model_path) as model:
            one_round(model)
            one_round(model, stop_stream_early=True)
            gc.collect()
            assert dsinfer.open_handles() == {**before, **{"context": before.get("context", 0) + 1,
                                                           "model": before.get("model", 0) + 1}}
    assert dsinfer.open_handles() == before


def test_library_allocations_balance(default_model_path):
    ctx = dsinfer.Context(n_threads=2, track_allocations=True)
    assert ctx.live_allocations > 0  # the hooks are in use
    empty = ctx.live_allocations
    model = ctx.load_model(default_model_path)
    # The first session creates the model's state pool for its n_ctx (execution core v2:
    # one pool per context size, shared by the model's sessions, freed with the model), so
    # the level is taken after one round; every later round must come back to it.
    one_round(model)
    gc.collect()
    warm = ctx.live_allocations
    for early in (False, True, False):
        one_round(model, stop_stream_early=early)
        gc.collect()
        assert ctx.live_allocations == warm, "sessions/detokenizers left allocations behind"
    model.close()
    assert ctx.live_allocations == empty, "the model left allocations behind"
    ctx.close()
    assert ctx.live_allocations == 0
    assert ctx._alloc.total > 10


def test_python_memory_flat(default_model_path):
    with dsinfer.Context(n_threads=2) as ctx, ctx.load_model(default_model_path) as model:
        for _ in range(3):  # warm caches (ctypes type caches, tokenizer paths)
            one_round(model)
            one_round(model, stop_stream_early=True)
        gc.collect()
        tracemalloc.start(10)
        try:
            base = tracemalloc.take_snapshot()
            for _ in range(100):
                one_round(model)
                one_round(model, stop_stream_early=True)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    growth = sum(d.size_diff for d in after.compare_to(base, "filename"))
    # 200 rounds: a leak of 48 bytes per round (one small object) exceeds this; the
    # noise (ctypes and weakref caches resizing) stays below 4 KiB
    assert growth < 8 * 1024, "Python memory grew by %d bytes over 200 rounds" % growth
