"""The one tool-call grammar (components.env.tool_calls): `TaggedCalls`, which the environments' `ToolProtocol` and the
OpenAI endpoint's parsers read calls with, the parsers' readings of a turn (malformed calls stay text), and the stop
texts resolved to the sampler's stop tokens."""

from __future__ import annotations

import json

import pytest

from components.env import ToolProtocol
from components.env.tool_calls import HermesToolCalls, JsonToolCalls, TaggedCalls, TagToolCalls, stop_token_ids

TURN = "I will compute <call>calc(1+2)</call> and <call> 3*4 </call> then <call>python(print(1)"


def _calls(parsed: tuple[str, list[dict]]) -> tuple[str, list[tuple[str, dict]]]:
    """(text, [(name, decoded arguments)]), the calls' random ids left out."""
    text, calls = parsed
    assert all(c["id"].startswith("call_") and len(c["id"]) == 29 and c["type"] == "function" for c in calls)
    return text, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_tagged_calls_find_closed_and_unclosed_calls_in_order():
    tags = TaggedCalls("<call>", "</call>")
    assert tags.find(TURN) == [("calc(1+2)", True), ("3*4", True), ("python(print(1)", False)]
    assert tags.closed(TURN) == ["calc(1+2)", "3*4"]
    assert tags.outside(TURN) == "I will compute  and  then <call>python(print(1)"  # the unclosed call stays
    assert tags.find("<call>a <call>b</call>") == [("a <call>b", True)]  # calls do not nest: the first close ends it
    assert tags.find("<call>m\n</call>\n") == [("m", True)] and tags.outside("<call>m\n</call>\n") == ""
    assert tags.find("plain") == [] and tags.outside(" plain ") == "plain"


def test_the_environment_and_the_endpoint_read_the_same_calls():
    # the tiny tool-using policy writes <call>123*45</call>: ToolProtocol hands the body to the default tool, TagToolCalls
    # to the one tool it names
    assert [tuple(c) for c in ToolProtocol().calls(TURN)] == [
        ("calc(1+2)", "calc", "1+2", None),
        ("3*4", None, "", None),
        ("python(print(1)", None, "", "the call was not closed with '</call>'"),
    ]
    tag = TagToolCalls("calc", "expression")
    assert tag.stop_texts == ("</call>",)
    assert _calls(tag.parse(TURN)) == (
        "I will compute  and  then <call>python(print(1)",
        [("calc", {"expression": "calc(1+2)"}), ("calc", {"expression": "3*4"})],
    )
    assert _calls(tag.parse("<call>x</call> y <call>z")) == ("y <call>z", [("calc", {"expression": "x"})])
    assert tag.parse("<call>unclosed\n") == ("<call>unclosed\n", [])


def test_hermes_calls_are_read_and_a_malformed_one_leaves_the_whole_turn_as_text():
    hermes = HermesToolCalls()
    turn = 'pre <tool_call>\n{"name": "calc", "parameters": {"x": 1}}\n</tool_call> mid <tool_call>{"name": "f"}</tool_call> post'
    assert _calls(hermes.parse(turn)) == ("pre  mid  post", [("calc", {"x": 1}), ("f", {})])
    for malformed in [
        '<tool_call>{"name": "calc", "arguments": {}}</tool_call><tool_call>not json</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["x"]</tool_call>',  # not an object
        '<tool_call>{"name": "a"}',  # never closed
    ]:
        assert hermes.parse(malformed) == (malformed, [])
    assert hermes.stop_texts == ()
    other_tags = HermesToolCalls("<tc>", "</tc>").parse('<tc>{"name": "g", "arguments": {"y": 1}}</tc>')
    assert _calls(other_tags) == ("", [("g", {"y": 1})])


def test_json_calls_are_a_whole_turn_that_is_one_object():
    json_calls = JsonToolCalls()
    assert _calls(json_calls.parse(' <|python_tag|>{"name": "f", "parameters": {"a": 2}} ')) == ("", [("f", {"a": 2})])
    for text in ['{"name": 3}', "[1]", 'say {"name": "f"}', "<call>12*7</call>"]:
        assert json_calls.parse(text) == (text, [])


def test_stop_texts_become_the_samplers_stop_tokens(tokenizer):
    # the tiny model's tokenizer: "</call>" is 7 tokens
    (one,) = tokenizer.encode("7", add_special_tokens=False)
    with pytest.warns(UserWarning, match=r"^model.agent.init_args.tool_calls: the stop text '</call>' is 7 tokens"):
        assert stop_token_ids(tokenizer, ["7", "</call>"], "model.agent.init_args.tool_calls") == [one]
