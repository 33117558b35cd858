"""Chat settings beyond the basics: presets, DRY / mirostat / XTC / JSON mode, and what new chats start with.

The engine tests run the real default model: each setting must reach the job and change what it generates.
"""
from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

from app.core.presets import BUILTIN_PRESETS, PRESET_FIELDS, preset_of
from app.core.remote_backend import chat_body
from app.core.chat_settings import ADVANCED_SAMPLER_FIELDS, ChatSettings
from app.preferences.preferences import Preferences
from tests.app.support import loop, make_window, run, store, wait_until  # noqa: F401 - fixtures

ADVANCED = ChatSettings(dry_multiplier=1.5, dry_base=2.0, dry_allowed_length=3, mirostat=True, mirostat_tau=2.5,
                        mirostat_eta=0.2, xtc_probability=0.4, xtc_threshold=0.2, json_mode=True)
JOB_FIELDS = {"system_prompt", "max_new_tokens", "seed", "stop_strings", "json_mode", "loras",
              "context_overflow", "stop_on_loops", "tools", "thinking", "reasoning_effort", "model"}  # go to the job (or the prompt), not the sampler


def test_no_chat_setting_is_dropped_on_the_way_to_the_sampler():
    """Every sampler field of ChatSettings, set away from its default, shows up in the engine's SamplerSettings."""
    sampler_fields = [f.name for f in fields(ChatSettings) if f.name not in JOB_FIELDS]
    assert set(ADVANCED_SAMPLER_FIELDS) <= set(sampler_fields)
    engine_name = {"repetition_penalty": "token_repetition_penalty"}
    for name in sampler_fields:
        changed = replace(ChatSettings(), **{name: getattr(ADVANCED, name)}) if name in ADVANCED_SAMPLER_FIELDS \
            else replace(ChatSettings(), **{name: {"temperature": 0.3, "top_k": 7, "top_p": 0.5, "min_p": 0.2,
                                                    "repetition_penalty": 1.3}[name]})
        got = getattr(changed.sampler_settings(), engine_name.get(name, name))
        assert got == getattr(changed, name) != getattr(ChatSettings().sampler_settings(), engine_name.get(name, name))


def test_advanced_settings_validate_and_survive_the_store(store):  # noqa: F811
    chat = store.create_chat("x", ADVANCED)
    assert store.chat(chat.id).settings == ADVANCED
    with pytest.raises(ValueError, match="dry_base"):
        replace(ChatSettings(), dry_base=0.5).validate()
    with pytest.raises(ValueError, match="xtc_probability"):
        replace(ChatSettings(), xtc_probability=2.0).validate()
    with pytest.raises(ValueError, match="json_mode"):
        replace(ChatSettings(), json_mode="yes").validate()
    # A chat saved by an older version (no advanced keys, no loop guard) loads with today's defaults for them.
    old = json.loads(ChatSettings().to_json())
    for key in ADVANCED_SAMPLER_FIELDS + ("json_mode", "stop_on_loops"):
        del old[key]
    assert ChatSettings.from_json(json.dumps(old)) == ChatSettings()
    # One saved before DRY was the default keeps the values it was saved with (every field is stored).
    saved = json.loads(ChatSettings().to_json()) | {"dry_multiplier": 0.0}
    assert ChatSettings.from_json(json.dumps(saved)).dry_multiplier == 0.0
    with pytest.raises(ValueError, match="stop_on_loops"):
        replace(ChatSettings(), stop_on_loops=1).validate()


def test_settings_dialog_shows_and_returns_the_advanced_samplers(qtbot):
    from app.panels.settings_dialog import SettingsDialog

    dlg = SettingsDialog(ADVANCED, prefs=Preferences())
    qtbot.addWidget(dlg)
    assert dlg.settings() == ADVANCED  # every field shown and read back
    assert dlg.json_mode.isChecked() and dlg.mirostat.isChecked()
    dlg.dry_multiplier.setValue(0.0)
    dlg.mirostat.setChecked(False)
    dlg.json_mode.setChecked(False)
    assert dlg.stop_on_loops.isChecked() and dlg.stop_on_loops.text() == "Stop replies that repeat themselves"
    dlg.stop_on_loops.setChecked(False)
    got = dlg.settings()
    assert (got.dry_multiplier, got.mirostat, got.json_mode, got.stop_on_loops) == (0.0, False, False, False)
    assert got.xtc_probability == 0.4 and got.system_prompt == ADVANCED.system_prompt
    assert got.context_overflow == "truncate_middle"  # the chat's context policy is shown and kept
    dlg.context_overflow.setCurrentIndex(dlg.context_overflow.findText("Stop at limit"))
    assert dlg.settings().context_overflow == "stop_at_limit"
    assert dlg.sizeHint().height() <= 700 and dlg.sizeHint().width() <= 1024  # fits a 1366x768 screen


def test_presets_fill_the_sampler_and_keep_the_rest(qtbot):
    from app.panels.settings_dialog import CUSTOM, SettingsDialog

    for values in BUILTIN_PRESETS.values():
        assert set(values) == set(PRESET_FIELDS)
        replace(ChatSettings(), **values).validate()
    base = ChatSettings(system_prompt="Talk like a sailor.", max_new_tokens=99, seed=5, stop_strings=("END",))
    dlg = SettingsDialog(base, prefs=Preferences())
    qtbot.addWidget(dlg)
    assert dlg.preset.currentText() == "Balanced"  # the chat defaults: the engine's plus DRY
    assert not dlg.delete_preset_btn.isEnabled()  # built-ins can't be deleted
    dlg.choose_preset("Creative")
    got = dlg.settings()
    assert preset_of(got) == BUILTIN_PRESETS["Creative"] and got.dry_multiplier > 0 and got.xtc_probability > 0
    assert (got.system_prompt, got.max_new_tokens, got.seed, got.stop_strings) == (
        base.system_prompt, base.max_new_tokens, base.seed, base.stop_strings)
    assert dlg.preset.currentText() == "Creative"
    dlg.temperature.setValue(0.55)
    assert dlg.preset.currentText() == CUSTOM  # hand-edited values name no preset


def test_user_presets_are_saved_and_offered_again(qtbot, tmp_path, monkeypatch):
    from app.panels.settings_dialog import CUSTOM, SettingsDialog

    path = tmp_path / "prefs.ini"
    monkeypatch.setenv("PAGEDECK_SETTINGS", str(path))
    dlg = SettingsDialog(ChatSettings(), prefs=Preferences())
    qtbot.addWidget(dlg)
    dlg.temperature.setValue(0.42)
    dlg.dry_multiplier.setValue(1.25)
    dlg.save_preset("  My   coder ")
    assert dlg.preset.currentText() == "My coder"
    with pytest.raises(ValueError, match="built-in"):
        dlg.save_preset("Precise")
    assert "My coder" in path.read_text()  # on disk, in the file the tests chose
    again = SettingsDialog(replace(ChatSettings(), temperature=0.42, dry_multiplier=1.25), prefs=Preferences(path))
    qtbot.addWidget(again)
    assert again.preset.currentText() == "My coder"
    again.choose_preset("Precise")
    again.choose_preset("My coder")
    assert again.settings().temperature == 0.42 and again.settings().dry_multiplier == 1.25
    assert again.delete_preset_btn.isEnabled()
    again.delete_preset_btn.click()
    assert "My coder" not in Preferences(path).presets()
    assert again.preset.currentText() == CUSTOM and again.settings().temperature == 0.42


def test_new_chats_start_with_the_default_prompt_and_preset(qtbot, loop, store):  # noqa: F811
    async def body():
        prefs = Preferences()
        prefs.system_prompt = "You answer in haiku."
        prefs.preset = "Precise"
        window = make_window(qtbot, store)
        pane = window.new_chat()
        settings = pane.session.settings
        assert settings.system_prompt == "You answer in haiku."
        assert preset_of(settings) == BUILTIN_PRESETS["Precise"]
        assert store.chat(pane.session.chat_id).settings == settings
        prefs.preset = "Creative"  # only new chats change
        assert window.new_chat().session.settings.xtc_probability > 0
        assert pane.session.settings.xtc_probability == 0

    run(loop, body())


def test_remote_chats_send_json_mode_and_refuse_what_they_cannot_send():
    body = chat_body("m", [{"role": "user", "content": "hi"}], ChatSettings(json_mode=True))
    assert body["response_format"] == {"type": "json_object"}
    assert not any(key.startswith("dry") for key in body)  # the default DRY is the local engine's: not sent
    for change, name in (({"dry_multiplier": 1.0}, "DRY"), ({"mirostat": True}, "mirostat"),
                         ({"xtc_probability": 0.5}, "XTC")):
        with pytest.raises(ValueError, match=name):
            chat_body("m", [], replace(ChatSettings(), **change))


# ---- the real default model -------------------------------------------------------------------------

GREEDY = dict(temperature=0.0, top_k=1, top_p=1.0, repetition_penalty=1.0, max_new_tokens=40, seed=11,
              dry_multiplier=0.0, stop_on_loops=False)  # the plain sampler each advanced one is compared with


async def _reply(service, settings: ChatSettings, text: str) -> tuple[str, str]:
    job, _ = service.start_job("probe", [{"role": "user", "content": text}], settings)
    out, last = "", {}
    async for r in job:
        if r.get("stage") == "streaming":
            out, last = out + r.get("text", ""), r
    service.job_ended("probe")
    return out, last.get("eos_reason")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_advanced_sampler_changes_what_the_default_model_writes(qtbot, loop, store):  # noqa: F811
    from app.chat.chat_session import ChatSession
    from app.local.engine_service import EngineService
    from app.panels.settings_dialog import SettingsDialog

    async def body():
        service = EngineService()
        errors = []
        service.load_failed.connect(errors.append)
        assert await service.load({"cache_tokens": 4096}), errors
        try:
            # JSON mode, end to end: ticked in the dialog, sent from the chat, parsed from the stored reply.
            session = ChatSession(store, store.create_chat("json").id, service)
            dlg = SettingsDialog(replace(ChatSettings(**GREEDY), max_new_tokens=120), prefs=Preferences())
            qtbot.addWidget(dlg)
            dlg.json_mode.setChecked(True)
            session.set_settings(dlg.settings())
            question = "Give me a cat's name and age."
            session.send(question)
            await wait_until(lambda: not session.running, 600, "the JSON reply")
            reply = store.messages(session.chat_id)[-1]
            assert reply.stats.state == "done", reply.stats
            assert isinstance(json.loads(reply.content), dict), reply.content
            plain, _ = await _reply(service, ChatSettings(**GREEDY), question)
            with pytest.raises(json.JSONDecodeError):
                json.loads(plain)  # the same question without JSON mode: prose

            # DRY: greedy decoding loops on the repeated word; DRY breaks the loop.
            ask = "Write the word hello twenty times."
            looped, _ = await _reply(service, ChatSettings(**GREEDY), ask)
            dry, _ = await _reply(service, replace(ChatSettings(**GREEDY), dry_multiplier=2.0), ask)
            assert looped.lower().count("hello") >= 10, looped
            assert dry.lower().count("hello") <= looped.lower().count("hello") // 2, dry

            # Mirostat with a tiny target surprise keeps only the top token: greedy output, at temperature 1.
            story = "Tell me a story about a fox."
            # Warm the prefix cache first: a prompt prefilled whole and one resumed from cached pages differ in
            # the last float bits, enough to flip a near-tie; compared runs must start alike.
            await _reply(service, ChatSettings(**GREEDY), story)
            greedy, _ = await _reply(service, ChatSettings(**GREEDY), story)
            free = dict(GREEDY, temperature=1.0, top_k=0)
            miro, _ = await _reply(service, ChatSettings(**free, mirostat=True, mirostat_tau=0.01), story)
            assert miro == greedy
            unconstrained = {await _reply(service, replace(ChatSettings(**free), seed=s), story) for s in (1, 2)}
            assert any(text != greedy for text, _ in unconstrained)  # so mirostat is what made it greedy

            # XTC (always on, threshold 0) removes every choice but the least likely of the top-k: with top-k 2
            # the reply never starts with greedy's first token.
            for seed in (1, 2):
                xtc, _ = await _reply(service, ChatSettings(**dict(free, top_k=2, seed=seed), xtc_probability=1.0,
                                                            xtc_threshold=0.0), story)
                first = service.tokenizer.encode(greedy)[0, 0]
                assert service.tokenizer.encode(xtc)[0, 0] != first, (xtc, greedy)
        finally:
            await service.close()
            service.model = service.generator = service.cache = service.router = None  # free the model now

    run(loop, body(), timeout=900)
