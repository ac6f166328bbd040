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

function sameDay(a: Date, b: Date) {
  return a.getFullYear() === b.getFullYear() && a.getMonth() === b.getMonth() && a.getDate() === b.getDate();
}

/** Hours and minutes, as a messenger shows a message's time. */
export function clock(ms: number): string {
  return new Date(ms).toLocaleTimeString([], { hour: 'numeric', minute: '2-digit' });
}

/** A conversation list's time: today the clock, then "Yesterday", a weekday, or a date. */
export function shortTime(ms: number, now = Date.now()): string {
  const d = new Date(ms);
  const today = new Date(now);
  if (sameDay(d, today)) return clock(ms);
  const yesterday = new Date(now - 86_400_000);
  if (sameDay(d, yesterday)) return 'Yesterday';
  if (now - ms < 6 * 86_400_000 && ms < now) return d.toLocaleDateString([], { weekday: 'short' });
  if (d.getFullYear() === today.getFullYear()) return d.toLocaleDateString([], { day: 'numeric', month: 'short' });
  return d.toLocaleDateString([], { day: 'numeric', month: 'short', year: 'numeric' });
}

/** A day separator's label: "Today", "Yesterday", or the full date. */
export function dayLabel(ms: number, now = Date.now()): string {
  const d = new Date(ms);
  if (sameDay(d, new Date(now))) return 'Today';
  if (sameDay(d, new Date(now - 86_400_000))) return 'Yesterday';
  return d.toLocaleDateString([], { weekday: 'long', day: 'numeric', month: 'long', year: 'numeric' });
}

/** Whether two times fall on the same local day. */
export function sameLocalDay(a: number, b: number): boolean {
  return sameDay(new Date(a), new Date(b));
}

/** "2 minutes ago", "just now", "in 5 minutes". */
export function ago(ms: number, now = Date.now()): string {
  const s = Math.round((ms - now) / 1000);
  if (Math.abs(s) < 45) return 'just now';
  const rtf = new Intl.RelativeTimeFormat([], { numeric: 'auto' });
  const units: [Intl.RelativeTimeFormatUnit, number][] = [
    ['day', 86_400],
    ['hour', 3600],
    ['minute', 60],
  ];
  for (const [unit, secs] of units) if (Math.abs(s) >= secs) return rtf.format(Math.round(s / secs), unit);
  return rtf.format(s, 'second');
}
