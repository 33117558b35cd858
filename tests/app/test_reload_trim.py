"""A reload gives the old model's freed heap back to the OS at once, not at the new model's first reply:
the generator trims only after a step, so a reloaded app left idle kept the old model resident (~0.7 GB
on the default model). What a reload may leave is fragmentation of the C heap, bounded and well under half
the model (the load maps its large blocks on their own: engine.model.heap.loading_heap), so growth of half the
model's weights or more means the old model stayed."""
import pytest

from tests.app.soak_meter import status_mb
from tests.app.support import loop, run  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def settled(model) -> None:
    """Wait for the model's weights to settle behind it (engine.model.settle, at the lowest priority): on busy
    cores a reading taken as the load returned caught the new model half settled, not the old one kept."""
    assert model.wait_settled(120)
    if model.settle_thread is not None:
        model.settle_thread.join(120)


def test_reload_without_replies_leaves_no_old_model_resident(qtbot, loop):
    from app.local.engine_service import EngineService

    async def body():
        service = EngineService()
        request = {"path": None, "cache_tokens": 8 * 512}  # the default model, as the app soak loads it
        try:
            assert await service.load(request)
            settled(service.model)
            anon = status_mb("RssAnon")[0]
            held = service.model.memory_bytes() / 2**20
            for _ in range(2):
                assert await service.load(request)
                settled(service.model)
                grew = status_mb("RssAnon")[0] - anon
                assert grew < held / 2, f"RSS grew {grew:.0f} MB at a reload (the model holds {held:.0f} MB)"
        finally:
            await service.close()

    run(loop, body(), 240)
