#!/usr/bin/env python3
# Writes conversations.json, the conversation corpus of reference_test.cc:
#   python3 tests/text/jinja/make_conversations.py > tests/text/jinja/conversations.json
import json
weather_tool = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. \"Paris\""}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
search_tool = {"type": "function", "function": {"name": "search", "description": "Search the web. Returns a list of results; use sparingly.", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3}, "filters": {"type": "object", "properties": {"site": {"type": "string"}, "after": {"type": "string", "format": "date"}}}}, "required": ["query"]}, "return": {"type": "array", "items": {"type": "string"}}}}
C = []
def conv(name, messages, tools=None, extra=None):
    c = {"name": name, "messages": messages}
    if tools is not None: c["tools"] = tools
    if extra is not None: c["extra"] = extra
    C.append(c)
u = lambda t, **k: {"role": "user", "content": t, **k}
a = lambda t, **k: {"role": "assistant", "content": t, **k}
s = lambda t: {"role": "system", "content": t}
def tc(id, name, args): return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}
def tool(id, content): return {"role": "tool", "tool_call_id": id, "content": content}

conv("single_user", [u("Hello!")])
conv("system_user", [s("You are a helpful assistant."), u("What is the capital of France?")])
conv("multi_turn", [s("You are terse."), u("Hi"), a("Hello. How can I help?"), u("Tell me a joke."), a("Why did the chicken cross the road? To get to the other side."), u("Another one, please.")])
long = [s("You are a careful assistant who answers in full sentences.")]
for i in range(10):
    long.append(u(f"Question {i+1}: what is {i} + {i*3}?"))
    long.append(a(f"The answer to question {i+1} is {i + i*3}."))
long.append(u("Summarize our conversation."))
conv("twenty_turns", long)
conv("no_system_multi", [u("first"), a("second"), u("third")])
conv("assistant_last", [u("Complete this: The quick brown"), a("fox jumps over the lazy dog.")])
conv("tool_call_object_args", [s("You can call tools."), u("What's the weather in Paris?"),
     a("", tool_calls=[tc("call12345", "get_weather", {"city": "Paris", "unit": "celsius"})]),
     tool("call12345", "{\"temperature\": 21.5, \"condition\": \"sunny\"}"),
     a("It is 21.5 °C and sunny in Paris."), u("And in Berlin?")], tools=[weather_tool])
conv("tool_call_string_args", [u("What's the weather in Tokyo?"),
     a("", tool_calls=[tc("callABCDE", "get_weather", "{\"city\": \"Tokyo\"}")]),
     tool("callABCDE", "Cloudy, 18 degrees")], tools=[weather_tool])
conv("parallel_tool_calls", [s("Use tools when needed."), u("Weather in Rome and Oslo, and search for flights."),
     a("Let me check.", tool_calls=[tc("call00001", "get_weather", {"city": "Rome"}), tc("call00002", "get_weather", {"city": "Oslo", "unit": "fahrenheit"}), tc("call00003", "search", {"query": "flights Rome Oslo", "max_results": 5, "filters": {"site": "example.com"}})]),
     tool("call00001", "Rome: 25C"), tool("call00002", "Oslo: 50F"), tool("call00003", "[\"flight A\", \"flight B\"]")], tools=[weather_tool, search_tool])
conv("tool_result_last", [u("Search for cats"), a("", tool_calls=[tc("call99999", "search", {"query": "cats"})]), tool("call99999", "Cats are small carnivorous mammals.")], tools=[search_tool])
conv("reasoning_content", [u("What is 2+2?"), a("2 + 2 = 4.", reasoning_content="The user asks a simple sum. 2 plus 2 is 4."), u("And 3+3?")])
conv("reasoning_content_last", [u("Think about 7*6."), a("42", reasoning_content="\nSeven times six is forty-two.\n")])
conv("think_in_content", [u("Pick a number."), a("<think>\nI will pick 7.\n</think>\n\n7"), u("Why?")])
conv("think_in_content_last", [u("Pick a letter."), a("<think>\nmaybe q\n</think>\n\nq")])
conv("enable_thinking_false", [u("Be quick: capital of Japan?")], extra={"enable_thinking": False})
conv("enable_thinking_true", [s("Reason step by step."), u("Is 97 prime?")], extra={"enable_thinking": True})
conv("tools_no_calls", [s("You are a weather bot."), u("Hi there")], tools=[weather_tool, search_tool])
conv("tools_no_system", [u("Find news about Mars")], tools=[search_tool])
conv("empty_content", [u(""), a(""), u("still there?")])
conv("unicode", [s("Réponds en français. 回答は日本語で。"), u("Ünïcödé ✓ — 你好，世界！ 🚀🌍 مرحبا עברית ÅΣ ß ǅ ﬁ"), a("Voilà : 😀 (emoji), \u00a0NBSP, zero\u200bwidth, e\u0301 combining."), u("Ǆ and ΣΑΣ and İ")])
conv("jinja_looking_content", [u("{{ messages }} {% if true %}x{% endif %} {# comment #} {{- '-' -}}"), a("{% raw %}not raw{% endraw %} }} %} #}"), u("{{")])
conv("whitespace_content", [s("  padded system  \n"), u("\n\n  lots of space \t \n"), a("   \n answer with spaces \n  "), u("\t")])
conv("special_characters", [u("Quotes \" and ' and back\\slash and \\n literal, tab\tand\ncontrol \u0001\u001f end"),
     a("", tool_calls=[tc("callQUOTE", "search", {"query": "say \"hi\" \\ </tool_call> \n <|im_end|>", "unicode": "é😀", "ctrl": "\u0007"})]),
     tool("callQUOTE", "ok \"quoted\"")], tools=[search_tool])
conv("numbers_in_arguments", [u("numbers"), a("", tool_calls=[tc("callNUM01", "calc", {"int": 100, "neg": -7, "float": 1.5, "whole_float": 3.0, "small": 0.000001, "tiny": 1e-7, "big": 1e21, "bigger": 123456789012345680000, "exp": 2.5e-8, "zero": 0, "negzero": -0.0, "bools": [True, False, None]})]), tool("callNUM01", "done")])
conv("named_user", [s("Group chat."), u("Hi all", name="alice"), u("Hello alice", name="bob")])
conv("content_parts", [u([{"type": "text", "text": "Describe this image."}, {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}])])
conv("system_parts", [{"role": "system", "content": [{"type": "text", "text": "System in parts."}]}, u("hello")])
conv("null_content_tool_call", [u("Weather?"), {"role": "assistant", "content": None, "tool_calls": [tc("callNULL1", "get_weather", {"city": "Lima"})]}, tool("callNULL1", "warm")], tools=[weather_tool])
conv("system_only", [s("Only a system message.")])
conv("consecutive_users", [u("one"), u("two")])
conv("tool_response_user_content", [u("<tool_response>\nfake\n</tool_response>"), a("noted"), u("real question")])
conv("custom_date_string", [u("What day is it?")], extra={"date_string": "01 Jan 2025"})
conv("tools_in_system_message", [s("System prompt here."), u("call something")], tools=[weather_tool], extra={"tools_in_user_message": False})
c_bt = {"name": "builtin_tools", "messages": [s("You are helpful."), u("Search the web for Llama 3.1")], "extra": {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]},
        "extension_templates": {"llama3.1": "uses the reject filter, which the reference lacks; Strata renders it as Jinja2 does"}}
C.append(c_bt)
conv("long_content", [u("word " * 2000), a("ok " * 500), u("x" * 5000)])

print(json.dumps({"comment": "Conversations of the reference corpus: every template in templates/manifest.json renders each of them with add_generation_prompt false and true, with @huggingface/jinja (render_reference.mjs) and with Strata; jinja_tests compares the results byte for byte. No member name is integer-like (JavaScript would reorder such keys).", "conversations": C}, ensure_ascii=False, indent=1))
