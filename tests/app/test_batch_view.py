"""The batch view in a real window on a real generator (tiny random model): run, pause, restart the window
on the same database, resume with no row run twice, export; a template naming a missing column is refused."""
import csv

import pytest

from app.core.store import Store
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)
ROWS = 10


def write_inputs(path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["city", "country"])
        w.writeheader()
        w.writerows({"city": f"City{i}", "country": f"Country{i}"} for i in range(ROWS))


def fill(view, path, template="Describe {city} in {country}."):
    view.file.setText(str(path))
    view.template.setText(template)
    view.system.setText("You are a travel guide.")
    view.max_tokens.setValue(12)


def test_run_pause_restart_resume_export(qtbot, loop, store, tiny_model, tmp_path):
    write_inputs(tmp_path / "cities.csv")

    async def body():
        service = await loaded_service(tiny_model)
        window = make_window(qtbot, store, service)
        view = window.batch_view
        fill(view, tmp_path / "cities.csv", "Describe {city} in {region}.")
        view.start_btn.click()
        assert "{region}" in view.message.text() and "city, country" in view.message.text()
        assert view.run_id is None
        fill(view, tmp_path / "cities.csv")
        view.controller.concurrency = 2  # a few rows at a time, so the pause lands mid-run
        view.start_btn.click()
        await wait_until(lambda: view.progress.value() >= 3, what="three rows done")
        view.pause_btn.click()
        await wait_until(lambda: not view.controller.running, what="the pause")
        done = view.progress.value()
        assert 3 <= done < ROWS and view.table.rowCount() == done
        assert view.resume_btn.isEnabled() and "Paused" in view.message.text()
        assert service.running == []  # the rows cut off let go of their jobs

        # A new window on a new Store over the same database file: the run reopens where it stopped.
        store2 = Store.open(store.path.parent)
        view2 = make_window(qtbot, store2, service).batch_view
        assert view2.run_id == view.run_id and view2.progress.value() == done and view2.table.rowCount() == done
        assert view2.resume_btn.isEnabled() and not view2.start_btn.isDown()
        view2.resume_btn.click()
        await wait_until(lambda: view2.controller.running, what="the resume")
        await wait_until(lambda: not view2.controller.running, what="the rest of the rows")
        assert view2.progress.value() == ROWS and view2.table.rowCount() == ROWS
        assert view2.message.text().startswith("Done")
        keys = store2._db.execute("SELECT row_index FROM batch_results WHERE run_id=?", (view2.run_id,)).fetchall()
        assert sorted(k[0] for k in keys) == list(range(ROWS))  # every row stored once
        assert view2.export(tmp_path / "out.csv") == ROWS
        with open(tmp_path / "out.csv", newline="") as f:
            out = list(csv.DictReader(f))
        assert [r["city"] for r in out] == [f"City{i}" for i in range(ROWS)]
        assert all(r["output"] and r["eos_reason"] and not r["error"] for r in out)
        store2.close()
        await service.close()

    run(loop, body())
