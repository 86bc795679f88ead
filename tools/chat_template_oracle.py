#!/usr/bin/env python3
"""Renders chat-template branch cases with jinja2 exactly as transformers' apply_chat_template does
(sandboxed, trim_blocks + lstrip_blocks, tojson = json.dumps(ensure_ascii=False), raise_exception)
and writes them as the oracle that tests/text/chat_template_test.cpp checks.

  python3 tools/chat_template_oracle.py ../shared/fixtures/tokenizer/Qwen3.5-4B.jinja \
      tests/text/chat_template_oracle_cases.json

Tool-call arguments given as JSON strings are decoded to objects before rendering, as serving
stacks do (the bare template raises on a string); render_chat_template does the same.
"""
import json
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_template(path):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(path, encoding="utf-8") as f:
        return env.from_string(f.read())


def decode_string_arguments(messages):
    out = []
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("tool_calls"), list):
            m = dict(m)
            calls = []
            for c in m["tool_calls"]:
                c = json.loads(json.dumps(c))
                target = c.get("function", c) if isinstance(c, dict) else None
                if isinstance(target, dict) and isinstance(target.get("arguments"), str):
                    target["arguments"] = json.loads(target["arguments"])
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


U = {"role": "user", "content": "What is 2+2?"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
ODD_TOOL = {"type": "function", "function": {
    "name": "odd", "description": "quotes \" backslash \\ newline \n tab \t ctl \u0001\u001f del \u007f "
                                  "é 日本 🦙 </tools> \u2028",
    "parameters": {"type": "object", "properties": {
        "x": {"type": "number", "minimum": -1.5, "maximum": 1e16, "multipleOf": 1e-05, "default": 0.1},
        "n": {"type": "integer", "default": -0, "big": 18446744073709551615, "neg": -9223372036854775808},
        "flag": {"type": "boolean", "default": True}, "none": None,
        "empty_obj": {}, "empty_list": [], "nested": [[1, 2.5, "a"], {"k": [True, False, None]}],
        "floats": [1.0, 100.0, 1234567890123456.0, 1e17, 0.0001, 1.5e-07, -0.0, 3.141592653589793, 2.5e+300]},
        "required": []}}}


def call(name, arguments, wrap=True):
    fn = {"name": name, "arguments": arguments}
    return {"type": "function", "function": fn} if wrap else fn


CASES = [
    # system turn
    ("system_whitespace_is_trimmed", [{"role": "system", "content": "\n  Be brief.\u3000\n"}, U], {}),
    ("system_empty_string", [{"role": "system", "content": ""}, U], {}),
    ("system_content_parts", [{"role": "system", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}, U], {}),
    ("system_with_tools_appended", [{"role": "system", "content": "Be brief."}, U], {"tools": [WEATHER]}),
    ("system_blank_with_tools_not_appended", [{"role": "system", "content": " \n "}, U], {"tools": [WEATHER]}),
    ("tools_two_definitions", [U], {"tools": [WEATHER, {"type": "function", "function": {"name": "noop"}}]}),
    ("tools_json_escaping_and_numbers", [U], {"tools": [ODD_TOOL]}),
    ("tools_empty_list_is_no_tools", [U], {"tools": []}),
    ("system_twice_error", [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, U], {}),
    ("system_after_user_error", [U, {"role": "system", "content": "late"}], {}),
    ("system_image_error", [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, U], {}),
    ("system_video_error", [{"role": "system", "content": [{"type": "video", "video": "x"}]}, U], {}),
    # messages and roles
    ("no_messages_error", [], {}),
    ("unknown_role_error", [U, {"role": "developer", "content": "x"}], {}),
    ("missing_role_error", [U, {"content": "x"}], {}),
    ("only_system_no_user_error", [{"role": "system", "content": "s"}], {}),
    ("only_wrapped_tool_response_user_error", [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}], {}),
    ("user_content_null", [{"role": "user", "content": None}, {"role": "user", "content": "q"}], {}),
    ("user_content_missing", [{"role": "user"}, U], {}),
    ("user_content_whitespace_trimmed", [{"role": "user", "content": "\u00a0\t q \x1c\n"}], {}),
    ("user_content_number_error", [{"role": "user", "content": 5}], {}),
    ("user_content_object_error", [{"role": "user", "content": {"text": "x"}}], {}),
    # content parts
    ("user_text_parts", [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]}], {}),
    ("user_image_and_video_parts", [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "a.png"}}, {"type": "text", "text": "and"},
        {"type": "video", "video": "v.mp4"}, {"type": "image"}, {"image": "b.png"}]}], {}),
    ("vision_ids_number_across_messages", [
        {"role": "user", "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "first"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "video"}]}], {"add_vision_id": True}),
    ("text_part_scalars", [{"role": "user", "content": [{"text": 5}, {"text": 2.5}, {"text": 1e-05}, {"text": True}, {"text": None}, {"type": "text", "text": "!"}]}], {}),
    ("string_parts_use_substring_tests", [{"role": "user", "content": ["see image", "a video", "plain text", ["image"]]}], {}),
    ("part_without_text_error", [{"role": "user", "content": [{"type": "text"}]}], {}),
    ("part_number_error", [{"role": "user", "content": [5]}], {}),
    # assistant turns and reasoning
    ("history_reasoning_dropped_before_last_query", [
        U, {"role": "assistant", "content": "4", "reasoning_content": "Add them."}, {"role": "user", "content": "And 3+3?"}], {}),
    ("reasoning_kept_after_last_query", [
        U, {"role": "assistant", "content": "4", "reasoning_content": "\n Add them. \n"}], {"add_generation_prompt": False}),
    ("reasoning_from_think_tags_in_content", [
        U, {"role": "assistant", "content": "<think>\n\nstep one\n\n</think>\n\n\nThe answer is 4."}], {"add_generation_prompt": False}),
    ("reasoning_think_tags_before_last_query_dropped", [
        U, {"role": "assistant", "content": "<think>r</think>4"}, {"role": "user", "content": "ok"}], {}),
    ("reasoning_field_wins_over_think_tags", [
        U, {"role": "assistant", "content": "<think>a</think>b", "reasoning_content": "R"}], {"add_generation_prompt": False}),
    ("reasoning_field_null_falls_back_to_tags", [
        U, {"role": "assistant", "content": "<think>a</think>b", "reasoning_content": None}], {"add_generation_prompt": False}),
    ("reasoning_multiple_think_blocks", [
        U, {"role": "assistant", "content": "x<think>a<think>b\n</think>c</think>\n d"}], {"add_generation_prompt": False}),
    ("close_think_without_open", [U, {"role": "assistant", "content": "just reasoning</think>answer"}], {"add_generation_prompt": False}),
    ("assistant_content_null", [U, {"role": "assistant", "content": None}], {"add_generation_prompt": False}),
    ("assistant_content_parts", [U, {"role": "assistant", "content": [{"type": "text", "text": "part"}]}], {"add_generation_prompt": False}),
    ("assistant_first_then_user", [{"role": "assistant", "content": "Hi, ask me."}, U], {}),
    ("generation_prompt_thinking_off_after_history", [U, {"role": "assistant", "content": "4"}, {"role": "user", "content": "5?"}], {"enable_thinking": False}),
    # tool calls
    ("tool_call_with_content_before", [
        U, {"role": "assistant", "content": "Let me check.", "tool_calls": [call("get_weather", {"city": "Paris"})]}], {"tools": [WEATHER], "add_generation_prompt": False}),
    ("tool_call_whitespace_content", [
        U, {"role": "assistant", "content": "  \n", "tool_calls": [call("get_weather", {"city": "Paris"})]}], {"add_generation_prompt": False}),
    ("tool_call_null_content", [
        U, {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Paris"})]}], {"add_generation_prompt": False}),
    ("tool_calls_two_in_one_turn", [
        U, {"role": "assistant", "content": "", "tool_calls": [call("a", {"x": "1"}), call("b", {"y": "2"}, wrap=False)]}], {"add_generation_prompt": False}),
    ("tool_call_argument_types", [
        U, {"role": "assistant", "content": "", "tool_calls": [call("f", {
            "s": "multi\nline", "i": 42, "neg": -7, "f": 2.5, "whole": 3.0, "tiny": 1e-05, "big": 1e16,
            "t": True, "fa": False, "n": None, "list": [1, "two", [3.0]], "obj": {"k": "v", "é": "ü"},
            "empty": {}, "unicode": "日本 🦙", "quote": "say \"hi\""})]}], {"add_generation_prompt": False}),
    ("tool_call_arguments_as_json_string", [
        U, {"role": "assistant", "content": "", "tool_calls": [call("f", "{\"z\": 1, \"a\": {\"b\": [1.50, true]}, \"s\": \"x\"}")]}], {"add_generation_prompt": False}),
    ("tool_call_without_arguments", [U, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "now"}}]}], {"add_generation_prompt": False}),
    ("tool_call_empty_arguments", [U, {"role": "assistant", "content": "", "tool_calls": [call("now", {})]}], {"add_generation_prompt": False}),
    ("tool_calls_empty_list", [U, {"role": "assistant", "content": "x", "tool_calls": []}], {"add_generation_prompt": False}),
    ("tool_calls_object_is_ignored", [U, {"role": "assistant", "content": "x", "tool_calls": {"name": "f"}}], {"add_generation_prompt": False}),
    ("tool_call_arguments_null_error", [U, {"role": "assistant", "content": "", "tool_calls": [call("f", None)]}], {}),
    ("tool_call_arguments_list_error", [U, {"role": "assistant", "content": "", "tool_calls": [call("f", [1])]}], {}),
    ("tool_call_without_name_error", [U, {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}], {}),
    ("tool_call_name_not_string_error", [U, {"role": "assistant", "content": "", "tool_calls": [call(5, {})]}], {}),
    ("tool_calls_string_error", [U, {"role": "assistant", "content": "", "tool_calls": "f"}], {}),
    # tool responses
    ("tool_responses_grouped_in_one_user_turn", [
        U, {"role": "assistant", "content": "", "tool_calls": [call("a", {}), call("b", {})]},
        {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}, {"role": "tool", "content": [{"type": "text", "text": "C"}]}], {}),
    ("tool_response_then_assistant_then_user", [
        U, {"role": "assistant", "content": "", "tool_calls": [call("a", {})]},
        {"role": "tool", "content": " A "}, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "thanks"}], {}),
    ("multi_step_tool_keeps_reasoning_of_each_step", [
        {"role": "system", "content": "sys"}, U,
        {"role": "assistant", "content": "", "reasoning_content": "step 1", "tool_calls": [call("a", {"q": 1})]},
        {"role": "tool", "content": "r1"},
        {"role": "assistant", "content": "<think>step 2</think>", "tool_calls": [call("b", {"q": 2})]},
        {"role": "tool", "content": "r2"}], {"tools": [WEATHER]}),
    ("user_tool_response_wrapper_is_not_a_query", [
        U, {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [call("a", {})]},
        {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},
        {"role": "assistant", "content": "It is 42.", "reasoning_content": "got it"}], {"add_generation_prompt": False}),
    ("tool_message_first", [{"role": "tool", "content": "orphan"}, U], {}),
    ("tool_message_last_without_generation_prompt", [U, {"role": "assistant", "content": "", "tool_calls": [call("a", {})]}, {"role": "tool", "content": "x"}], {"add_generation_prompt": False}),
    ("tool_after_system", [{"role": "system", "content": "s"}, {"role": "tool", "content": "t"}, U], {}),
    # generation prompt
    ("no_generation_prompt_thinking_off_ignored", [U], {"add_generation_prompt": False, "enable_thinking": False}),
]


def main():
    template = make_template(sys.argv[1])
    cases = []
    for name, messages, opts in CASES:
        case = {"name": name, "messages": messages}
        for key in ("tools", "add_generation_prompt", "enable_thinking", "add_vision_id"):
            if key in opts:
                case[key] = opts[key]
        case.setdefault("add_generation_prompt", True)
        kwargs = {k: case[k] for k in ("enable_thinking", "add_vision_id") if k in case}
        try:
            case["expected"] = template.render(messages=decode_string_arguments(messages), tools=case.get("tools"),
                                               add_generation_prompt=case["add_generation_prompt"], **kwargs)
        except jinja2.exceptions.TemplateError as e:
            # raise_exception and jinja's UndefinedError are both TemplateErrors; keep the message only
            # for the template's own raise_exception calls, whose text render_chat_template mirrors.
            case["error"] = str(e) if type(e) is jinja2.exceptions.TemplateError else ""
        except (TypeError, ValueError) as e:
            case["error"] = ""
        cases.append(case)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"template": "Qwen3.5-4B.jinja", "renderer": f"jinja2 {jinja2.__version__} as transformers",
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
