// Random templates for differential testing against the reference (deterministic: a fixed
// seed). Two families: typed expressions (numbers, strings, arrays, booleans through
// operators, filters, methods, slices and tests) and whitespace-control layouts (text,
// newlines, Unicode spaces, tags with and without `-`, nested blocks, comments, the
// generation tag). Constructs where Strata deliberately differs from the reference
// (first/last of an empty list, indexing into the middle of an astral character) are not
// generated; docs/chat-templates.md lists them.

function rng(seed) {
  // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export const kContext = {
  x: 5, y: -3, f: 2.25, g: -0.75, big: 1e21, tiny: 1e-7,
  s: "Mixed Case Text", p: "  padded\t", e: "",
  a: [5, 3, 8, 1], b: ["pear", "Apple", "fig"],
  ms: [{ role: "user", n: 2 }, { role: "assistant", n: 1 }],
  mix: [1, 2.5, "s", true, null], o: { k: 1, j: "v" }, nested: { a: { b: [1, 2] } },
  t: true, fl: false, v: " val\n",
};

export function generateCases(seed, count) {
  const random = rng(seed);
  const pick = (xs) => xs[Math.floor(random() * xs.length)];
  const chance = (p) => random() < p;
  const int = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));

  const nums = ["0", "1", "2", "3", "-1", "7", "10", "0.5", "1.5", "2.0", "-2.5", "0.1", "100", "1000000",
    "3.14159", "x", "y", "f", "g", "big", "tiny"];
  const strs = ["s", "p", "e", "'abc'", "'Hello, World'", "'  spaced  out  '", "'ÉCOLE été'", "'日本語テキスト'",
    "'a\\nb\\nc'", "'x,y,,z'", "'12'", "'-3.5'", "'1e3'", "'0x1F'", "' 42 '", "'ΣΑΣ σ'", "'ǅungla'", "'straße'",
    "'😀 emoji 🚀'"];
  const arrs = ["a", "b", "ms", "[1, 2, 3]", "['x', 'Y', 'z']", "mix", "[3.5, -1, 2]", "range(4)", "range(10, 0, -3)"];

  const num = (d) => {
    if (d <= 0 || chance(0.4)) return pick(nums);
    const r = random();
    if (r < 0.5) return `(${num(d - 1)} ${pick(["+", "-", "*", "/", "//", "%", "**"])} ${num(d - 1)})`;
    if (r < 0.6) return `-${num(d - 1)}`;
    if (r < 0.8) {
      return "(" + pick([
        () => `${str(d - 1)}|length`, () => `${arr(d - 1)}|length`, () => `${str(d - 1)}|int`,
        () => `${str(d - 1)}|float`, () => `${num(d - 1)}|abs`, () => `${num(d - 1)}|int`,
        () => `${num(d - 1)}|float`,
      ])() + ")";
    }
    return `(${num(d - 1)} if ${bool(d - 1)} else ${num(d - 1)})`;
  };
  const str = (d) => {
    if (d <= 0 || chance(0.35)) return pick(strs);
    const r = random();
    if (r < 0.3) return `(${str(d - 1)} ~ ${pick([num, str, arr, bool])(d - 1)})`;
    if (r < 0.4) return `(${str(d - 1)} + ${pick([num, str])(d - 1)})`;
    if (r < 0.75) {
      return str(d - 1) + pick(["|upper", "|lower", "|title", "|capitalize", "|trim", "|string", ".upper()",
        ".lower()", ".strip()", ".lstrip()", ".rstrip()", ".title()", ".capitalize()", "|replace('a', '_')",
        "|replace('', '.', 3)", ".replace('l', 'L', 1)", "[1:]", "[::-1]", "[:3]", "[-2:]", "[::2]",
        "|indent(2)", "|indent(2, true, true)", ".split(',')|join('+')", ".split()|join('_')",
        ".split(' ', 1)|join('|')", "|tojson", "|tojson(ensure_ascii=true)", "|join('-')",
        ".startswith('a') ~ ''", ".endswith(('t', 'e')) ~ ''"]);
    }
    if (r < 0.85) return `(${num(d - 1)}|string)`;
    return `(${arr(d - 1)}|join(', '))`;
  };
  const arr = (d) => {
    if (d <= 0 || chance(0.4)) return pick(arrs);
    const r = random();
    if (r < 0.5) {
      return arr(d - 1) + pick(["|sort", "|sort(reverse=true)", "|reverse", "|unique", "|list", "[1:]",
        "[::-1]", "[:2]", " + [9]"]);
    }
    if (r < 0.7) {
      const items = [];
      for (let i = int(1, 3); i > 0; i--) items.push(pick([num, str, bool])(d - 1));
      return `[${items.join(", ")}]`;
    }
    if (r < 0.85) return `${str(d - 1)}.split(${pick(["", "','", "' '", "'a'"])})`;
    return `(${pick(["o", "{'b': 2, 'a': 1}", "nested"])}.items()|list)`;
  };
  const bool = (d) => {
    if (d <= 0 || chance(0.3)) return pick(["true", "false", "t", "fl"]);
    const r = random();
    if (r < 0.3) return `(${num(d - 1)} ${pick(["<", ">", "<=", ">=", "==", "!="])} ${num(d - 1)})`;
    if (r < 0.5) return `(${str(d - 1)} ${pick(["==", "!=", "in", "not in"])} ${str(d - 1)})`;
    if (r < 0.6) return `(${pick([num, str])(d - 1)} in ${arr(d - 1)})`;
    if (r < 0.8) {
      return `(${pick([num, str, arr])(d - 1)} is ${pick(["", "not "])}` +
        pick(["number", "string", "integer", "iterable", "sequence", "defined", "none", "lower", "upper",
          "true", "false", "mapping"]) + ")";
    }
    if (r < 0.9) return `(${bool(d - 1)} ${pick(["and", "or"])} ${bool(d - 1)})`;
    return `(not ${bool(d - 1)})`;
  };

  const spaces = [" ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2028", " \n ", "\n  ", "\t\n"];
  const texts = ["a", "b c", "word", "é", "{", "}", "x}", "%", "#", "-", "{x", "%}", "#}", "-}", "}}"];
  const dash = () => pick(["", "-"]);
  const piece = (depth) => {
    const r = random();
    if (r < 0.35) return pick(spaces);
    if (r < 0.5) return pick(texts);
    const l = dash();
    const rr = dash();
    const w = pick([" ", "", "  ", "\n", "\t"]);
    if (r < 0.65) return `{{${l}${w}${pick(["'x'", "1", "v", "' y '", "'\\n'"])}${w}${rr}}}`;
    if (r < 0.75) return `{#${l}${pick([" c ", "", "x\ny", " - "])}${rr}#}`;
    if (depth >= 3) return "t";
    if (r < 0.85) {
      const alt = chance(0.5) ? `{%${dash()} else ${dash()}%}${body(depth + 1)}` : "";
      return `{%${l}${w}if ${pick(["true", "false", "v"])}${w}${rr}%}${body(depth + 1)}${alt}{%${dash()} endif ${dash()}%}`;
    }
    if (r < 0.95) return `{%${l} for i in [1, 2] ${rr}%}${body(depth + 1)}{%${dash()} endfor ${dash()}%}`;
    return `{%${l} set z ${rr}%}${body(depth + 1)}{%${dash()} endset ${dash()}%}[{{ z }}]`;
  };
  const body = (depth) => {
    let out = "";
    for (let i = int(0, 5); i > 0; i--) out += piece(depth);
    return out;
  };

  const cases = [];
  for (let k = 0; k < count; k++) {
    let template;
    const kind = random();
    if (kind < 0.45) {
      template = `{{ ${pick([num, str, arr, bool])(int(1, 4))} }}`;
    } else if (kind < 0.55) {
      template = `{% for w in ${arr(int(0, 3))} %}[{{ w }}|{{ loop.index0 }}|{{ loop.revindex }}]{% endfor %}`;
    } else {
      template = body(0) + pick(["", "\n", "\n\n", " "]);
      if (chance(0.1)) template += "  {%- generation -%}  x {% endgeneration %}\n";
    }
    cases.push(template);
  }
  return cases;
}
