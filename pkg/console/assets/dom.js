// h builds an element. Children that are strings become text nodes: no markup from data ever
// reaches the parser (this file is the only place elements are made, and it never asks the
// browser to parse HTML). attrs are set as attributes; "class" and ARIA/data/for/etc. only.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === false || v === undefined || v === null) continue;
    if (k.startsWith("on")) {
      el.addEventListener(k.slice(2), v);
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// replace swaps the content of el for children.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

// chips renders a string map as key=value chips, sorted by key.
export function chips(map) {
  return Object.keys(map || {}).sort().map((k) => h("span", { class: "chip" }, map[k] === "" ? k : `${k}=${map[k]}`));
}
