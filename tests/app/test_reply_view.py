"""A stored reply is shown as it streamed: a call written as plain JSON (fenced or bare, as small coder
models write them) naming one of the chat's tools is not shown as text, while JSON naming no offered tool
stays part of the answer."""
from app.agent.reply_rounds import reply_view
from app.agent.tool_hub import ToolHub

FENCED = 'Let me check.\n```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'


def test_a_call_left_in_the_answer_is_not_shown_as_json():
    _, shown = reply_view(FENCED, [], None, ToolHub.names_seen(("weather/get_weather",)))
    assert "Let me check." in shown and "get_weather" not in shown and "```" not in shown


def test_json_naming_no_offered_tool_stays_the_answer():
    _, shown = reply_view(FENCED, [], None, ToolHub.names_seen(("files/read_file",)))
    assert '"name": "get_weather"' in shown


def test_names_seen_cover_both_names_chat_tools_can_give():
    assert ToolHub.names_seen(("weather/get_weather", "maps/get_weather")) == {
        "get_weather", "weather_get_weather", "maps_get_weather"}
