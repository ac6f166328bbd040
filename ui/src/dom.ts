// A tiny DOM builder: elements with attributes, listeners and children, no framework.

type Child = Node | string | number | null | undefined | false | Child[];
type Attrs = Record<string, unknown>;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs | null = null,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2).toLowerCase(), v as EventListener);
    } else if (k === 'class') {
      el.className = String(v);
    } else if (k === 'value' && 'value' in el) {
      (el as unknown as { value: string }).value = String(v);
    } else if (k === 'checked' && 'checked' in el) {
      (el as unknown as { checked: boolean }).checked = Boolean(v);
    } else {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el: Node, children: Child[]) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }
}

/** Replaces the children of `el`. */
export function mount(el: Element, ...children: Child[]) {
  el.replaceChildren();
  append(el, children);
}

let idSeq = 0;
/** A fresh element id, for label/for pairs. */
export function uid(prefix = 'f'): string {
  idSeq += 1;
  return `${prefix}-${idSeq}`;
}

/** A labelled input. */
export function field(label: string, input: HTMLInputElement | HTMLTextAreaElement | HTMLSelectElement) {
  const id = input.id || uid();
  input.id = id;
  return h('div', { class: 'field' }, h('label', { for: id }, label), input);
}

export function fmtTime(ms: number): string {
  const d = new Date(ms);
  return d.toLocaleString();
}
