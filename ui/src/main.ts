// The app shell: navigation, routing, paste-anywhere and the screens. Protocol-specific details
// come from the data the runtime returns (a contact's `protocol`, whoami's per-protocol sections),
// so a new protocol needs no new screen.

import './harden';
import { renderSVG } from 'uqr';
import './style.css';
import { type Theme, setTheme, theme } from './theme';
import {
  type AuditRow,
  type Backend,
  BackendError,
  type Contact,
  type GroupMember,
  type GroupMessage,
  type GroupSummary,
  type InviteStatus,
  type HostedRelay,
  type Identity,
  type Message,
  type MovePlan,
  type OutboundMode,
  type RelayStatus,
  type ReviewItem,
  type Status,
  type Whoami,
  pickBackend,
} from './backend';
import { asnetView } from './asnet';
import { ago, clock, dayLabel, field, fmtTime, h, mount, sameLocalDay, shortTime } from './dom';
import { type Recognised, recognise } from './paste';
import { S } from './strings';
import { ReadMarkers } from './unread';

const backend: Backend = pickBackend();
const root = document.getElementById('app') as HTMLElement;
const KINDS = ['send', 'ask', 'reply', 'list'];

// ----- small shared pieces ------------------------------------------------------------------

/** An error in plain words for the person; its code and the runtime's words go to the log. */
function errorText(e: unknown): string {
  if (e instanceof BackendError) {
    console.warn(`switchboard: ${e.code}: ${e.message}`);
    return S.error(e.code, e.message);
  }
  console.warn('switchboard:', e);
  return S.errors.unexpected;
}

const notice = h('div', { class: 'notice', role: 'status', 'aria-live': 'polite' });
let noticeTimer: ReturnType<typeof setTimeout> | undefined;
/** The screen a notice belongs to: leaving it clears the notice. */
let noticeHash = '';
/** Shows a notice; it clears on navigation, or after a few seconds (errors stay longer). */
function say(text: string, isError = false) {
  notice.textContent = text;
  notice.className = isError ? 'notice error' : 'notice';
  notice.setAttribute('role', isError ? 'alert' : 'status');
  noticeHash = location.hash;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(clearNotice, isError ? 12_000 : 4_000);
}
function clearNotice() {
  clearTimeout(noticeTimer);
  notice.textContent = '';
  notice.className = 'notice';
}

/** `text` as a QR code image (an SVG data URL: crisp at any scale, allowed by the CSP's img-src). */
function qr(text: string, label: string): HTMLImageElement {
  const img = h('img', { class: 'qr', alt: label, width: 160, height: 160 });
  try {
    img.src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(renderSVG(text, { ecc: 'M', border: 1 }));
  } catch {
    // Too long for a QR code: the text is shown beside it anyway.
    img.hidden = true;
  }
  return img;
}

function badge(text: string, cls = '') {
  return h('span', { class: `badge ${cls}`.trim() }, text);
}

function protocolBadge(protocol: string) {
  return badge(protocol, `proto proto-${protocol.replace(/[^a-z0-9_-]/gi, '')}`);
}

function copyButton(text: string) {
  return h(
    'button',
    {
      type: 'button',
      class: 'small',
      onclick: async (e: Event) => {
        const b = e.currentTarget as HTMLButtonElement;
        try {
          await navigator.clipboard.writeText(text);
          b.textContent = S.me.copied;
        } catch {
          b.textContent = '✗';
        }
      },
    },
    S.me.copy,
  );
}

/** The per-protocol sections of whoami: every object-valued key is one protocol identity. */
function identities(w: Whoami): [string, Identity][] {
  return Object.entries(w).filter(
    (e): e is [string, Identity] => typeof e[1] === 'object' && e[1] !== null && !Array.isArray(e[1]),
  );
}

function identityCard(protocol: string, id: Identity) {
  const shareable = id.address ?? id.id ?? '';
  const number = id.safety_number ?? id.fingerprint_short ?? id.fingerprint ?? '';
  return h(
    'section',
    { class: 'card identity', 'data-protocol': protocol, 'aria-label': protocol },
    h('h3', null, protocolBadge(protocol)),
    h(
      'dl',
      null,
      shareable && [
        h('dt', null, S.me.address),
        h('dd', null, h('code', { class: 'address' }, shareable), ' ', copyButton(shareable)),
      ],
      number && [h('dt', null, id.safety_number ? S.me.safety : S.me.fingerprint), h('dd', { class: 'safety' }, number)],
      id.relay && [h('dt', null, S.me.relay), h('dd', null, id.relay)],
    ),
    shareable && qr(shareable, S.me.qr(protocol)),
  );
}

// ----- routing ------------------------------------------------------------------------------

type Route =
  | { name: 'contacts' }
  | { name: 'conversation'; contact: string; highlight?: string }
  | { name: 'group'; group: string }
  | { name: 'verify'; contact: string }
  | { name: 'merge'; contact: string; other: string }
  | { name: 'agents' }
  | { name: 'review' }
  | { name: 'groups' }
  | { name: 'log' }
  | { name: 'settings' }
  | { name: 'network' }
  | { name: 'me' };

function parseRoute(): Route {
  const [, a, b, c] = location.hash.split('/').map(decodeURIComponent);
  switch (a) {
    case 'c':
      return b ? { name: 'conversation', contact: b, highlight: c } : { name: 'contacts' };
    case 'g':
      return b ? { name: 'group', group: b } : { name: 'groups' };
    case 'verify':
      return b ? { name: 'verify', contact: b } : { name: 'contacts' };
    case 'merge':
      return b && c ? { name: 'merge', contact: b, other: c } : { name: 'contacts' };
    case 'agents':
    case 'review':
    case 'groups':
    case 'log':
    case 'settings':
    case 'network':
    case 'me':
      return { name: a };
    default:
      return { name: 'contacts' };
  }
}

function go(hash: string) {
  if (location.hash === hash) void render();
  else location.hash = hash;
}

const main = h('main', { id: 'main', tabindex: '-1' });
let me: Whoami | null = null;
let rendering = 0;

function navLink(hash: string, label: string, current: boolean, count?: string) {
  let counter: HTMLElement | null = null;
  if (count) {
    counter = h('span', { class: 'nav-count' });
    navCounts.set(count, counter);
  }
  return h('a', { href: hash, 'aria-current': current ? 'page' : null }, label, counter);
}

function shell(route: Route) {
  navCounts.clear();
  const chats = route.name === 'contacts' || route.name === 'conversation' || route.name === 'group';
  const nav = h(
    'nav',
    { 'aria-label': S.nav.label },
    h('ul', null, [
      h('li', null, navLink('#/contacts', S.nav.contacts, chats, 'contacts')),
      h('li', null, navLink('#/agents', S.nav.agents, route.name === 'agents')),
      h('li', null, navLink('#/groups', S.nav.groups, route.name === 'groups', 'groups')),
      h('li', null, navLink('#/review', S.nav.review, route.name === 'review', 'review')),
      h('li', null, navLink('#/log', S.nav.log, route.name === 'log')),
      h('li', null, navLink('#/settings', S.nav.settings, route.name === 'settings')),
      h('li', null, navLink('#/me', S.nav.me, route.name === 'me')),
    ]),
  );
  document.body.classList.toggle('chat-layout', chats);
  mount(
    root,
    h('header', null, h('h1', null, S.appName), nav, me ? h('span', { class: 'whoami' }, me.name) : null),
    connectionBar,
    notice,
    main,
  );
  updateChrome();
}

/**
 * A selector for where the focus goes back to after a screen is rebuilt: the element with the same
 * id, or the link to the same place (a keyboard user tabbing through the chat list keeps their
 * place when a message arrives).
 */
function focusKey(active: HTMLElement | null): string {
  if (!active) return '';
  if (active.id) return `#${CSS.escape(active.id)}`;
  const href = active instanceof HTMLAnchorElement ? active.getAttribute('href') : null;
  return href ? `a[href="${CSS.escape(href)}"]` : '';
}

async function render(background = false) {
  const token = ++rendering;
  const hash = location.hash;
  const route = parseRoute();
  if (!background) shell(route);
  let view: Node;
  try {
    await refreshSummary();
    switch (route.name) {
      case 'contacts':
        view = await chatsView(null);
        break;
      case 'conversation':
        view = await chatsView(route.contact, route.highlight);
        break;
      case 'group':
        view = await chatsView(null, undefined, route.group);
        break;
      case 'verify':
        view = await verifyView(route.contact);
        break;
      case 'merge':
        view = await mergeView(route.contact, route.other);
        break;
      case 'agents':
        view = await agentsView();
        break;
      case 'review':
        view = await reviewView();
        break;
      case 'groups':
        view = await groupsView();
        break;
      case 'log':
        view = await logView();
        break;
      case 'settings':
        view = await settingsView();
        break;
      case 'network':
        view = await asnetView({ rpc: (req) => backend.asnet(req), act });
        break;
      case 'me':
        view = await meView();
        break;
    }
  } catch (e) {
    view = h('p', { class: 'error', role: 'alert' }, errorText(e));
  }
  if (token !== rendering) return; // a newer render won
  if (background) {
    // A refresh keeps what the person was typing and where the focus was.
    const typed = typedValues();
    const active = main.contains(document.activeElement) ? (document.activeElement as HTMLElement) : null;
    const focused = focusKey(active);
    const caret =
      active instanceof HTMLTextAreaElement || (active instanceof HTMLInputElement && active.type !== 'checkbox')
        ? [active.selectionStart, active.selectionEnd]
        : null;
    const scrolls = saveScrolls();
    mount(main, view);
    mountedHash = hash;
    restoreTyped(typed);
    restoreScrolls(scrolls, route);
    if (focused) {
      const el = main.querySelector<HTMLElement>(focused);
      el?.focus({ preventScroll: true });
      if (caret && (el instanceof HTMLTextAreaElement || el instanceof HTMLInputElement)) {
        try {
          el.setSelectionRange(caret[0], caret[1]);
        } catch {
          /* some input types have no selection */
        }
      }
    }
    updateChrome();
    return;
  }
  // The chat list's "Add a contact" field stands beside every chat screen: what was typed into
  // it while the screen changed stays (a navigation otherwise starts each screen afresh).
  const pasted = document.getElementById('paste-field');
  const pending = pasted instanceof HTMLInputElement ? pasted.value : '';
  const pasteFocused = document.activeElement === pasted;
  // Focus moved into the old screen while this one loaded (the person tabbed on): it stays on
  // the same element of the new screen, so a key pressed next is not lost.
  const movedTo =
    document.activeElement !== main && main.contains(document.activeElement) ? focusKey(document.activeElement as HTMLElement) : '';
  // A render of the screen already shown (the person went away and back before the screen
  // changed, and typed into it meanwhile) keeps what was typed, as a refresh does.
  const typed = mountedHash === hash ? typedValues() : null;
  mount(main, view);
  mountedHash = hash;
  if (typed) restoreTyped(typed);
  if (movedTo) main.querySelector<HTMLElement>(movedTo)?.focus({ preventScroll: true });
  const pasteField = document.getElementById('paste-field');
  if (pending && pasteField instanceof HTMLInputElement && !pasteField.value) {
    pasteField.value = pending;
    if (pasteFocused) pasteField.focus({ preventScroll: true });
  }
  scrollToNewest = true;
  restoreScrolls(new Map(), route);
  updateChrome();
  // Only a render of the screen it was meant for takes it: a render of the screen being left
  // that finishes after the navigation began would otherwise run it where its target is absent.
  const after = afterRender;
  if (after && after.hash === hash) {
    afterRender = null;
    after.run();
  }
}

/** The hash the screen on the page was rendered for. */
let mountedHash = '';

/** What the text fields of the screen on the page hold, by id. */
function typedValues(): Map<string, string> {
  const typed = new Map<string, string>();
  main.querySelectorAll<HTMLInputElement | HTMLTextAreaElement>('input[id], textarea[id]').forEach((el) => {
    if (el.type !== 'checkbox' && el.type !== 'radio') typed.set(el.id, el.value);
  });
  return typed;
}

/** Puts `typed` (from [`typedValues`]) back into the fields of the same ids on the new screen. */
function restoreTyped(typed: Map<string, string>) {
  for (const [id, value] of typed) {
    const el = document.getElementById(id) as HTMLInputElement | HTMLTextAreaElement | null;
    if (el && !el.disabled) el.value = value;
  }
  // The composer grows with what it holds.
  const compose = document.getElementById('compose');
  if (compose instanceof HTMLTextAreaElement && compose.value) compose.dispatchEvent(new Event('input'));
}

/** Runs once after the next full render of `hash` (e.g. focus a field on the screen navigated to). */
let afterRender: { hash: string; run: () => void } | null = null;

/** Navigates to `hash`, then runs `run` once that screen is on the page. */
function goThen(hash: string, run: () => void) {
  afterRender = { hash, run };
  go(hash);
}

/**
 * Whether the open conversation is kept at its newest message: set where the pane scrolls (by
 * the person or by us), not read from its geometry at refresh time, because the pane also
 * shrinks without scrolling (a notice above it, the composer growing) and that is not the person
 * scrolling up to read.
 */
let pinnedToEnd = true;

function atEnd(el: HTMLElement) {
  return el.scrollHeight - el.scrollTop - el.clientHeight < 40;
}

/** Keeps a conversation's message pane at its newest message while it is pinned there. */
function followNewest(log: HTMLElement) {
  log.addEventListener('scroll', () => {
    pinnedToEnd = atEnd(log);
  });
  new ResizeObserver(() => {
    if (pinnedToEnd && log.isConnected) log.scrollTop = log.scrollHeight;
  }).observe(log);
}

/** Scroll positions of the panes (by id) and whether each was at its end. */
function saveScrolls() {
  const out = new Map<string, { top: number; atEnd: boolean }>();
  for (const el of main.querySelectorAll<HTMLElement>('#message-scroll, .chat-list')) {
    const key = el.id || el.className;
    out.set(key, { top: el.scrollTop, atEnd: el.id === 'message-scroll' ? pinnedToEnd : atEnd(el) });
  }
  return out;
}

/** A conversation opens at its newest message and stays there as messages arrive, unless the
 * person scrolled up to read; a search result scrolls to the message found. */
function restoreScrolls(saved: Map<string, { top: number; atEnd: boolean }>, route: Route) {
  const list = main.querySelector<HTMLElement>('.chat-list');
  const prevList = list ? saved.get(list.className) : undefined;
  if (list && prevList) list.scrollTop = prevList.top;
  const log = main.querySelector<HTMLElement>('#message-scroll');
  if (!log) return;
  const prev = saved.get('message-scroll');
  const found = route.name === 'conversation' && route.highlight ? document.getElementById(`msg-${route.highlight}`) : null;
  if (found && !prev) found.scrollIntoView({ block: 'center' });
  else if (scrollToNewest || !prev || prev.atEnd) log.scrollTop = log.scrollHeight;
  else log.scrollTop = prev.top;
  scrollToNewest = false;
  pinnedToEnd = atEnd(log);
}

// ----- first run ----------------------------------------------------------------------------

function firstRun() {
  const name = h('input', { type: 'text', required: true, maxlength: 64, autocomplete: 'name', id: 'fr-name' });
  const relayUrl = h('input', { type: 'url', id: 'fr-relay', placeholder: 'https://relay.example', value: '' });
  const useUrl = h('input', { type: 'radio', name: 'relay-mode', id: 'fr-mode-url', value: 'url', checked: true });
  const host = h('input', { type: 'radio', name: 'relay-mode', id: 'fr-mode-host', value: 'host' });
  const err = h('p', { class: 'error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit' }, S.firstRun.create);
  const sync = () => {
    relayUrl.disabled = host.checked;
    relayUrl.required = !host.checked;
  };
  useUrl.addEventListener('change', sync);
  host.addEventListener('change', sync);
  const form = h(
    'form',
    {
      class: 'card',
      'aria-labelledby': 'fr-title',
      onsubmit: async (e: Event) => {
        e.preventDefault();
        err.hidden = true;
        submit.disabled = true;
        submit.textContent = S.firstRun.creating;
        try {
          const who = await backend.init({ name: name.value.trim(), relay: host.checked ? null : relayUrl.value.trim() });
          me = who;
          if (backend.kind === 'tauri') firstRunDone(who);
        } catch (x) {
          // A relay that does not answer: no identity was made; say what failed, in its words.
          err.textContent = x instanceof BackendError && x.code === 'relay' ? S.firstRun.relayDown(x.message) : errorText(x);
          err.hidden = false;
          submit.disabled = false;
          submit.textContent = S.firstRun.create;
        }
      },
    },
    h('h2', { id: 'fr-title' }, S.firstRun.title),
    h('p', null, S.firstRun.intro),
    field(S.firstRun.name, name),
    h(
      'fieldset',
      null,
      h('legend', null, S.firstRun.relayLegend),
      h('div', { class: 'radio' }, useUrl, h('label', { for: 'fr-mode-url' }, S.firstRun.relayUrl)),
      field(S.firstRun.relayUrlField, relayUrl),
      // Only the desktop app can host a relay (it embeds relay-lite); a browser shows no such choice.
      backend.canHostRelay
        ? [
            h('div', { class: 'radio' }, host, h('label', { for: 'fr-mode-host' }, S.firstRun.relayHost)),
            h('p', { class: 'muted', id: 'fr-host-note' }, S.firstRun.relayHostNote),
          ]
        : null,
    ),
    err,
    submit,
  );
  mount(root, h('main', { id: 'main' }, form));
  name.focus();
}

function firstRunDone(who: Whoami) {
  const cont = h('button', { type: 'button', onclick: () => start() }, S.firstRun.continue);
  mount(
    root,
    h(
      'main',
      { id: 'main' },
      h('h2', null, S.firstRun.done),
      h('p', null, S.me.intro),
      identities(who).map(([p, id]) => identityCard(p, id)),
      cont,
    ),
  );
  cont.focus();
}

// ----- contacts and paste -------------------------------------------------------------------

function contactBadges(c: Contact) {
  return [
    protocolBadge(c.protocol),
    c.blocked ? badge(S.contacts.blocked, 'danger') : c.state !== 'active' ? badge(c.state, 'state') : null,
    c.nearby ? h('span', { class: 'badge ok nearby', title: S.contacts.nearbyTitle }, S.contacts.nearby) : null,
    c.key_changed
      ? badge(S.contacts.keyChanged, 'danger')
      : c.verified
        ? badge(S.contacts.verified, 'ok')
        : badge(S.contacts.unverified, 'muted'),
  ];
}

// ----- the chat list: conversations by latest activity, unread counts ------------------------

/** One conversation in the list. */
interface Chat {
  contact: Contact;
  /** Its newest messages, oldest first (a window: enough for the preview and unread count). */
  msgs: Message[];
  last: Message | undefined;
  unread: number;
}

/** One group in the list: as `Chat`, from the group's log. */
interface GroupChat {
  g: GroupSummary;
  msgs: GroupMessage[];
  last: GroupMessage | undefined;
  unread: number;
}

/** What every screen's chrome shows: unread totals, the review count, the relay's health. */
interface Summary {
  chats: Chat[];
  requests: Contact[];
  groups: GroupChat[];
  review: ReviewItem[];
  status: Status | null;
}

/** Messages per conversation read for the list (preview, time, unread count up to this many). */
const LIST_WINDOW = 50;
let summary: Summary | null = null;
let reads: ReadMarkers | null = null;

function markers(): ReadMarkers {
  if (!reads) reads = new ReadMarkers(me?.profile ?? 'default');
  return reads;
}

function byActivity(a: Chat, b: Chat) {
  if (a.last && b.last) return b.last.ts - a.last.ts;
  if (a.last) return -1;
  if (b.last) return 1;
  return a.contact.name.localeCompare(b.contact.name);
}

async function refreshSummary(): Promise<Summary> {
  const [contacts, requests, groups, review, status] = await Promise.all([
    backend.contacts(),
    backend.requests(),
    backend.groups().catch(() => [] as GroupSummary[]),
    backend.reviewList().catch(() => [] as ReviewItem[]),
    backend.status().catch(() => null),
  ]);
  const active = contacts.filter((c) => c.state !== 'pending');
  // One entry per group: several local sessions in one group show once (the person's own first).
  const byGroup = new Map<string, GroupSummary>();
  for (const g of groups) if (!byGroup.has(g.group) || g.own) byGroup.set(g.group, g);
  const groupList = [...byGroup.values()];
  const [convs, logs] = await Promise.all([
    Promise.all(active.map((c) => backend.conversation(c.name, LIST_WINDOW).catch(() => [] as Message[]))),
    Promise.all(groupList.map((g) => backend.groupHistory(g.group, LIST_WINDOW).then((x) => x.messages).catch(() => [] as GroupMessage[]))),
  ]);
  const r = markers();
  const firstLook = r.fresh && summary === null;
  const chats = active.map((contact, i) => {
    const msgs = convs[i] ?? [];
    // The first start on this device: what is already there counts as read.
    if (firstLook) r.markRead(contact.name, msgs);
    return { contact, msgs, last: msgs[msgs.length - 1], unread: r.unread(contact.name, msgs) };
  });
  chats.sort(byActivity);
  const groupChats = groupList.map((g, i) => {
    const msgs = logs[i] ?? [];
    if (firstLook) r.markRead(groupKey(g.group), readable(msgs));
    const last = [...msgs].reverse().find((m) => m.kind !== 'alert') ?? msgs[msgs.length - 1];
    return { g, msgs, last, unread: r.unread(groupKey(g.group), readable(msgs)) };
  });
  summary = { chats, requests, groups: groupChats, review, status };
  return summary;
}

/** The read marker key of a group. */
function groupKey(group: string) {
  return `g:${group}`;
}

/** A group's messages as read markers count them: only what members wrote. */
function readable(msgs: GroupMessage[]) {
  return msgs.filter((m) => m.kind === 'message').map((m) => ({ id: m.id, direction: m.outgoing ? 'out' : 'in' }));
}

/** A group as the person knows it: their name for it, else its other members, never its id. */
function groupName(g: GroupSummary | undefined): string {
  if (!g) return S.groups.unnamed;
  if (g.name) return g.name;
  const others = g.member_names ?? [];
  return others.length > 0 ? S.groups.withMembers(others) : S.groups.unnamed;
}

/** Membership events as the runtime words them, without the fingerprints (the details show those). */
function eventText(m: GroupMessage): string {
  const text = m.content.replace(/ \((?:[0-9a-f]{4} ){7}[0-9a-f]{4}\)/g, '');
  return text
    .split(/; /)
    .map((t) => t.charAt(0).toUpperCase() + t.slice(1))
    .join('. ');
}

function groupPreview(m: GroupMessage | undefined): string {
  if (!m) return S.chats.noMessages;
  const text = m.content.replace(/\s+/g, ' ');
  if (m.kind !== 'message') return eventText(m);
  return m.outgoing ? S.chats.you(text) : `${m.from.name}: ${text}`;
}

function totals(s: Summary) {
  const chats = s.chats.reduce((n, c) => n + c.unread, 0);
  const groups = s.groups.reduce((n, g) => n + g.unread, 0);
  return { chats, groups, all: chats + groups };
}

/** The connection bar: shown while a relay the runtime uses cannot be reached. */
const connectionBar = h('div', { class: 'connection', role: 'status', 'aria-live': 'polite' });

function updateConnection(st: Status | null) {
  const down = (st?.relays ?? []).filter((r) => r.health?.state === 'disconnected');
  let text = '';
  if (down.length > 0) {
    const r = down[0];
    let host = r?.url ?? '';
    try {
      host = new URL(host).host;
    } catch {
      /* keep the URL as given */
    }
    text = `${S.connection.down(host, r?.health?.since ? clock(r.health.since) : '')} ${S.connection.queued(st?.outbox ?? 0)}`;
  }
  // Only a change is announced.
  if (connectionBar.textContent !== text) connectionBar.textContent = text;
  connectionBar.hidden = !text;
}

/** The counters in the navigation, keyed by route. */
const navCounts = new Map<string, HTMLElement>();

/** Unread totals in the navigation and the window title, the review count, the relay bar. */
function updateChrome() {
  const s = summary;
  if (!s) return;
  const t = totals(s);
  const set = (key: string, n: number, label: (n: number) => string) => {
    const el = navCounts.get(key);
    if (!el) return;
    mount(el, n > 0 ? [h('span', { class: 'count', 'aria-hidden': 'true' }, String(n)), h('span', { class: 'sr-only' }, ` (${label(n)})`)] : null);
  };
  set('contacts', t.chats, S.unread);
  set('groups', t.groups, S.unread);
  set('review', s.review.length, S.review.waiting);
  updateConnection(s.status);
  document.title = t.all > 0 ? `(${t.all}) ${S.appName}` : S.appName;
  backend.unreadTotal(t.all);
}

function preview(m: Message | undefined): string {
  if (!m) return S.chats.noMessages;
  if (m.kind === 'hello') return m.direction === 'out' ? S.conversation.helloOut : S.conversation.helloIn(m.from);
  if (m.kind === 'moved') return m.direction === 'out' ? S.conversation.movedOut(String(m.body)) : S.conversation.movedIn(m.from, String(m.body));
  const text = messageText(m).replace(/\s+/g, ' ');
  return m.direction === 'out' ? S.chats.you(text) : text;
}

/**
 * One row of the list. The link holds the name only (its accessible name says what it opens and
 * the unread count); the time, preview and count sit beside it, and the link covers the row.
 */
function chatRow(opts: {
  key: Record<string, string>;
  href: string;
  name: string;
  label: string;
  unread: number;
  current: boolean;
  time: number | null;
  preview: string;
  extra?: Node | null;
}) {
  const pid = `chat-preview-${Object.values(opts.key).join('-').replace(/[^A-Za-z0-9_-]/g, '_')}`;
  return h(
    'li',
    { ...opts.key, class: `chat${opts.unread > 0 ? ' unread' : ''}${opts.current ? ' current' : ''}` },
    h(
      'span',
      { class: 'chat-top' },
      h(
        'a',
        {
          href: opts.href,
          class: 'chat-name',
          'aria-label': opts.unread > 0 ? `${opts.label}, ${S.unread(opts.unread)}` : opts.label,
          'aria-describedby': pid,
          'aria-current': opts.current ? 'true' : null,
        },
        opts.name,
      ),
      opts.extra ?? null,
      opts.time !== null ? h('time', { class: 'chat-time', datetime: new Date(opts.time).toISOString() }, shortTime(opts.time)) : null,
    ),
    h(
      'span',
      { class: 'chat-bottom' },
      h('span', { class: 'chat-preview', id: pid }, opts.preview),
      opts.unread > 0 ? h('span', { class: 'unread-count', 'aria-hidden': 'true' }, String(opts.unread)) : null,
    ),
  );
}

function chatItem(c: Chat, open: string | null) {
  const name = c.contact.name;
  return chatRow({
    key: { 'data-contact': name },
    href: `#/c/${encodeURIComponent(name)}`,
    name,
    label: S.contacts.open(name),
    unread: c.unread,
    current: open === name,
    time: c.last ? c.last.ts : null,
    preview: preview(c.last),
    extra: c.contact.key_changed ? badge(S.contacts.keyChanged, 'danger') : null,
  });
}

function groupItem(gc: GroupChat, open: string | null) {
  const name = groupName(gc.g);
  return chatRow({
    key: { 'data-group': gc.g.group },
    href: `#/g/${encodeURIComponent(gc.g.group)}`,
    name,
    label: S.groups.open(name),
    unread: gc.unread,
    current: open === gc.g.group,
    time: gc.last ? gc.last.at : null,
    preview: groupPreview(gc.last),
  });
}

/** When a group was last active: its newest row, else when this profile joined or made it. */
function groupActivity(g: GroupChat): number | null {
  return g.last ? g.last.at : (g.g.joined_at ?? null);
}

/** One entry of the chat list: a contact or a group, where it opens and how much is unread. */
interface ListEntry {
  ts: number | null;
  name: string;
  href: string;
  unread: number;
  node: () => HTMLElement;
}

/** Contacts and groups in one list, the latest activity first (the list and its shortcuts). */
function listOrder(s: Summary, open: string | null, openGroup: string | null): ListEntry[] {
  const rows: ListEntry[] = [
    ...s.chats.map((c) => ({
      ts: c.last ? c.last.ts : null,
      name: c.contact.name,
      href: `#/c/${encodeURIComponent(c.contact.name)}`,
      unread: c.unread,
      node: () => chatItem(c, open),
    })),
    ...s.groups.map((g) => ({
      ts: groupActivity(g),
      name: groupName(g.g),
      href: `#/g/${encodeURIComponent(g.g.group)}`,
      unread: g.unread,
      node: () => groupItem(g, openGroup),
    })),
  ];
  rows.sort((a, b) => (a.ts !== null && b.ts !== null ? b.ts - a.ts : a.ts !== null ? -1 : b.ts !== null ? 1 : a.name.localeCompare(b.name)));
  return rows;
}

function chatItems(s: Summary, open: string | null, openGroup: string | null) {
  return listOrder(s, open, openGroup).map((r) => r.node());
}

/**
 * Alt+Shift+Down: the next chat with unread messages after the open one (wrapping); Alt+Down and
 * Alt+Up: the next and previous chat; Ctrl+M: the message box of the open chat.
 */
document.addEventListener('keydown', (e: KeyboardEvent) => {
  if (!me || document.querySelector('dialog[open]')) return;
  const composer = (e.ctrlKey || e.metaKey) && !e.altKey && !e.shiftKey && e.key.toLowerCase() === 'm';
  const step = e.altKey && !e.ctrlKey && !e.metaKey && (e.key === 'ArrowDown' || e.key === 'ArrowUp');
  if (!composer && !step) return;
  e.preventDefault();
  if (composer) {
    const el = document.getElementById('compose') as HTMLTextAreaElement | null;
    if (el && !el.disabled) el.focus();
    else say(S.chats.choose);
    return;
  }
  const s = summary;
  if (!s) return;
  const rows = listOrder(s, null, null);
  const here = rows.findIndex((r) => r.href === location.hash);
  const toCompose = () => document.getElementById('compose')?.focus();
  if (e.shiftKey) {
    if (e.key !== 'ArrowDown') return;
    // After the open chat, wrapping round; the open one itself last.
    const order = [...rows.slice(here + 1), ...rows.slice(0, here + 1)];
    const next = order.find((r) => r.unread > 0 && r.href !== location.hash);
    if (!next) {
      say(S.chats.noUnread);
      return;
    }
    goThen(next.href, toCompose);
    return;
  }
  if (rows.length === 0) return;
  const i = here < 0 ? (e.key === 'ArrowDown' ? 0 : rows.length - 1) : (here + (e.key === 'ArrowDown' ? 1 : -1) + rows.length) % rows.length;
  const target = rows[i];
  if (target) {
    goThen(target.href, toCompose);
  }
});

function requestsBox(requests: Contact[]) {
  if (requests.length === 0) return null;
  return h(
    'section',
    { 'aria-labelledby': 'req-title', class: 'requests' },
    h('h3', { id: 'req-title' }, S.contacts.pending),
    h(
      'ul',
      { class: 'list' },
      requests.map((c) => {
        // Accepting asks for a name: the one they claimed, to keep or change.
        const nameInput = h('input', { type: 'text', value: c.name, autocomplete: 'off', spellcheck: false, class: 'accept-name' });
        return h(
          'li',
          { class: 'request', 'data-contact': c.name },
          h('strong', null, c.name),
          ' ',
          contactBadges(c),
          c.request ? h('span', { class: 'says' }, ' ', S.contacts.says(c.request)) : null,
          c.safety_number ? h('div', { class: 'safety' }, c.safety_number) : null,
          field(S.contacts.approveName(c.name), nameInput),
          h(
            'div',
            { class: 'actions' },
            h(
              'button',
              {
                type: 'button',
                'aria-label': `${S.contacts.approve} ${c.name}`,
                onclick: () => {
                  const chosen = nameInput.value.trim() || c.name;
                  return act(() => backend.contactAccept(c.name, chosen), S.contacts.approved(chosen));
                },
              },
              S.contacts.approve,
            ),
            h(
              'button',
              {
                type: 'button',
                class: 'secondary',
                'aria-label': `${S.contacts.deny} ${c.name}`,
                onclick: () => act(() => backend.contactDeny(c.name)),
              },
              S.contacts.deny,
            ),
          ),
        );
      }),
    ),
  );
}

function addContactForm() {
  const pasteInput = h('input', { type: 'text', id: 'paste-field', autocomplete: 'off', spellcheck: false });
  return h(
    'form',
    {
      class: 'paste-form',
      'aria-labelledby': 'add-title',
      onsubmit: (e: Event) => {
        e.preventDefault();
        openPreview(pasteInput.value);
      },
    },
    h('h3', { id: 'add-title' }, S.contacts.add),
    h('p', { class: 'muted' }, S.contacts.pasteHint),
    h('div', { class: 'inline-field' }, field(S.contacts.pasteField, pasteInput), h('button', { type: 'submit' }, S.contacts.preview)),
  );
}

// ----- message search: the runtime has no search over message text (its `log` search reads the
// audit log), so the UI searches the conversations it loads, on this device ---------------------

/** Messages per conversation searched. */
const SEARCH_WINDOW = 500;
let msgSearch = '';
let searchTimer: ReturnType<typeof setTimeout> | undefined;

interface Hit {
  contact: string;
  m: Message;
}

async function searchMessages(s: Summary, q: string): Promise<Hit[]> {
  const needle = q.toLocaleLowerCase();
  const convs = await Promise.all(
    s.chats.map((c) => backend.conversation(c.contact.name, SEARCH_WINDOW).catch(() => [] as Message[])),
  );
  const hits: Hit[] = [];
  s.chats.forEach((c, i) => {
    for (const m of convs[i] ?? []) if (messageText(m).toLocaleLowerCase().includes(needle)) hits.push({ contact: c.contact.name, m });
  });
  return hits.sort((a, b) => b.m.ts - a.m.ts).slice(0, 200);
}

/** `text` with every occurrence of `q` marked. */
function marked(text: string, q: string): Node[] {
  const out: Node[] = [];
  const lower = text.toLocaleLowerCase();
  const needle = q.toLocaleLowerCase();
  let at = 0;
  for (let i = lower.indexOf(needle); i >= 0 && needle; i = lower.indexOf(needle, i + needle.length)) {
    out.push(document.createTextNode(text.slice(at, i)), h('mark', null, text.slice(i, i + needle.length)));
    at = i + needle.length;
  }
  out.push(document.createTextNode(text.slice(at)));
  return out;
}

function searchBox() {
  const input = h('input', {
    type: 'search',
    id: 'msg-search',
    value: msgSearch,
    autocomplete: 'off',
    placeholder: S.search.placeholder,
    'aria-describedby': 'search-hint',
  });
  input.addEventListener('input', () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => {
      msgSearch = input.value.trim();
      void render(true);
    }, 200);
  });
  input.addEventListener('keydown', (e: KeyboardEvent) => {
    if (e.key === 'Escape' && input.value) {
      e.preventDefault();
      input.value = '';
      msgSearch = '';
      void render(true);
    }
  });
  return h(
    'div',
    { class: 'search-box', role: 'search' },
    h('label', { for: 'msg-search', class: 'sr-only' }, S.search.label),
    input,
    h('p', { class: 'sr-only', id: 'search-hint' }, S.search.hint),
  );
}

function resultsList(hits: Hit[], q: string) {
  return [
    h('p', { class: 'muted results-note', role: 'status' }, S.search.count(hits.length, q), ' ', S.search.local(SEARCH_WINDOW)),
    h(
      'ul',
      { class: 'chats-ul', 'aria-label': S.search.results },
      hits.map(({ contact, m }) =>
        h(
          'li',
          { class: 'result' },
          h(
            'a',
            { href: `#/c/${encodeURIComponent(contact)}/${encodeURIComponent(m.id)}` },
            h(
              'span',
              { class: 'chat-top' },
              h('span', { class: 'chat-name' }, contact),
              h('time', { class: 'chat-time', datetime: new Date(m.ts).toISOString() }, shortTime(m.ts)),
            ),
            h('span', { class: 'chat-preview' }, m.direction === 'out' ? `${S.chats.you('')}` : null, marked(messageText(m), q)),
          ),
        ),
      ),
    ),
  ];
}

/** The left pane: requests, conversations and groups by latest activity, adding a contact. */
async function chatList(s: Summary, open: string | null, openGroup: string | null = null) {
  const q = msgSearch;
  return h(
    'section',
    { class: 'chat-list', 'aria-labelledby': 'chats-title' },
    h('h2', { id: 'chats-title' }, S.chats.title),
    searchBox(),
    q
      ? resultsList(await searchMessages(s, q), q)
      : [
          requestsBox(s.requests),
          s.chats.length === 0 && s.groups.length === 0
            ? h('p', { class: 'muted' }, S.contacts.empty)
            : h('ul', { class: 'chats-ul', 'aria-label': S.chats.title }, chatItems(s, open, openGroup)),
          addContactForm(),
        ],
  );
}

/** Ctrl+F (Cmd+F): search the messages, from any screen. */
document.addEventListener('keydown', (e: KeyboardEvent) => {
  if (!(e.ctrlKey || e.metaKey) || e.altKey || e.key.toLowerCase() !== 'f' || !me) return;
  if (document.querySelector('dialog[open]')) return;
  e.preventDefault();
  const focus = () => {
    const el = document.getElementById('msg-search') as HTMLInputElement | null;
    el?.focus();
    el?.select();
  };
  const r = parseRoute().name;
  if (r === 'contacts' || r === 'conversation' || r === 'group') focus();
  else {
    goThen('#/contacts', focus);
  }
});

/** Contacts and conversations: the list on the left, the open conversation (or group) on the right. */
async function chatsView(open: string | null, highlight?: string, openGroup: string | null = null) {
  const pane = open
    ? await conversationView(open, highlight)
    : openGroup
      ? await groupView(openGroup)
      : h('div', { class: 'chat-empty' }, h('p', { class: 'muted' }, S.chats.choose));
  // The open conversation marked itself read: the list and totals follow.
  const s = summary ?? (await refreshSummary());
  for (const c of s.chats) c.unread = markers().unread(c.contact.name, c.msgs);
  for (const g of s.groups) g.unread = markers().unread(groupKey(g.g.group), readable(g.msgs));
  return h(
    'div',
    { class: 'chats', 'data-open': open || openGroup ? 'conversation' : 'list' },
    await chatList(s, open, openGroup),
    h('div', { class: 'chat-pane' }, pane),
  );
}

async function act(f: () => Promise<unknown>, ok?: string) {
  try {
    await f();
    if (ok) say(ok);
    await render(true);
  } catch (e) {
    say(errorText(e), true);
  }
}

let dialog: HTMLDialogElement | null = null;

function openPreview(text: string) {
  const rec = recognise(text);
  if (!rec) {
    say(S.preview.notRecognised, true);
    return;
  }
  showPreview(rec);
}

function showPreview(rec: Recognised) {
  dialog?.remove();
  if (rec.action === 'join') {
    showJoin(rec);
    return;
  }
  const name = h('input', { type: 'text', id: 'preview-name', maxlength: 64, value: rec.suggestedName ?? '' });
  const fp = h('dd', { class: 'safety', id: 'preview-fingerprint' }, '…');
  if (rec.fingerprint) void rec.fingerprint.then((f) => (fp.textContent = f ?? '—'));
  else fp.textContent = '—';
  const err = h('p', { class: 'error', role: 'alert', hidden: true });
  const confirm = h('button', { type: 'submit' }, S.preview.add);
  const d = h(
    'dialog',
    { 'aria-labelledby': 'preview-title', class: 'preview', 'data-protocol': rec.protocol },
    h(
      'form',
      {
        method: 'dialog',
        onsubmit: async (e: Event) => {
          e.preventDefault();
          confirm.disabled = true;
          err.hidden = true;
          try {
            let c: Contact;
            if (rec.action === 'pair') c = await backend.pair(rec.value, name.value.trim() || undefined);
            else c = await backend.contactAdd(rec.value, name.value.trim() || undefined);
            d.close();
            d.remove();
            say(S.preview.added(c.name));
            // The new conversation opens, ready to type in, as in any messenger.
            goThen(`#/c/${encodeURIComponent(c.name)}`, () => document.getElementById('compose')?.focus());
          } catch (x) {
            err.textContent = errorText(x);
            err.hidden = false;
            confirm.disabled = false;
          }
        },
      },
      h('h2', { id: 'preview-title' }, S.preview.title),
      h(
        'dl',
        null,
        h('dt', null, S.preview.protocol),
        h('dd', null, protocolBadge(rec.protocol)),
        h('dt', null, S.preview.kind),
        h('dd', null, rec.what),
        rec.fields.map(([k, v]) => [h('dt', null, k), h('dd', null, h('code', null, v))]),
        h('dt', null, S.preview.fingerprint),
        fp,
      ),
      field(S.preview.name, name),
      err,
      h(
        'div',
        { class: 'actions' },
        confirm,
        h(
          'button',
          {
            type: 'button',
            class: 'secondary',
            onclick: () => {
              d.close();
              d.remove();
            },
          },
          S.preview.cancel,
        ),
      ),
    ),
  );
  document.body.appendChild(d);
  dialog = d;
  d.showModal();
  name.focus();
}

/** The relay and certificate an `untrusted_relay` error names (its `data`). */
function untrustedRelay(e: unknown): { url: string; cert: string } | null {
  if (!(e instanceof BackendError) || e.code !== 'untrusted_relay') return null;
  const url = e.data?.url;
  const cert = e.data?.cert_sha256;
  return typeof url === 'string' && typeof cert === 'string' && /^[0-9a-f]{64}$/.test(cert) ? { url, cert } : null;
}

/** A pasted group invite: who invites to what, and joining (which waits for the inviter). A
 * relay no contact vouched for is joined only after the person trusts its certificate here. */
function showJoin(rec: Recognised) {
  const err = h('p', { class: 'error', role: 'alert', hidden: true });
  const waiting = h('p', { class: 'muted', role: 'status' });
  const confirm = h('button', { type: 'submit' }, S.join.join);
  // Filled when the relay's certificate is unknown: the fingerprint, read in groups of four.
  const trust = h('div', { class: 'trust-relay', role: 'group', 'aria-labelledby': 'trust-title', hidden: true });
  let pending: { url: string; cert: string } | null = null;
  const close = () => {
    d.close();
    d.remove();
  };
  const d = h(
    'dialog',
    { 'aria-labelledby': 'join-title', 'aria-describedby': 'join-who', class: 'preview', 'data-protocol': rec.protocol },
    h(
      'form',
      {
        method: 'dialog',
        onsubmit: async (e: Event) => {
          e.preventDefault();
          confirm.disabled = true;
          err.hidden = true;
          try {
            if (pending) {
              await backend.relayTrust(pending.url, pending.cert);
              pending = null;
              trust.hidden = true;
              confirm.textContent = S.join.join;
            }
            waiting.textContent = S.join.waiting(rec.inviter);
            const joined = await backend.groupJoin(rec.value);
            close();
            // The notice belongs to the group's screen: navigate first.
            go(`#/g/${encodeURIComponent(joined.group)}`);
            say(S.join.joined(joined.name || rec.groupName || ''));
          } catch (x) {
            waiting.textContent = '';
            confirm.disabled = false;
            pending = untrustedRelay(x);
            if (pending) {
              trust.replaceChildren(
                h('h3', { id: 'trust-title' }, S.join.trustTitle),
                h('p', {}, S.join.trust(pending.url)),
                h('p', { class: 'safety', 'aria-label': S.join.trustFingerprint }, pending.cert.match(/.{4}/g)?.join(' ') ?? ''),
              );
              trust.hidden = false;
              confirm.textContent = S.join.trustAndJoin;
              confirm.focus();
              return;
            }
            err.textContent = errorText(x);
            err.hidden = false;
          }
        },
      },
      h('h2', { id: 'join-title' }, S.join.title),
      h('p', { id: 'join-who', class: 'join-who' }, S.join.who(rec.inviter, rec.groupName)),
      h('p', { class: 'muted' }, S.join.note(me?.name ?? '', rec.fields[0]?.[1] ?? '')),
      trust,
      waiting,
      err,
      h(
        'div',
        { class: 'actions' },
        confirm,
        h('button', { type: 'button', class: 'secondary', onclick: close }, S.preview.cancel),
      ),
    ),
  );
  document.body.appendChild(d);
  dialog = d;
  d.showModal();
  confirm.focus();
}

// Paste anywhere: text pasted outside an editable field is recognised and previewed.
document.addEventListener('paste', (e: ClipboardEvent) => {
  const t = e.target as HTMLElement | null;
  if (t && (t.closest('input, textarea, [contenteditable="true"]') || t.closest('dialog'))) return;
  if (!me) return;
  const text = e.clipboardData?.getData('text/plain') ?? '';
  const rec = recognise(text);
  if (!rec) {
    // Pasted into the window, not into a field: say why nothing happens.
    if (text.trim()) say(S.preview.notRecognised, true);
    return;
  }
  e.preventDefault();
  showPreview(rec);
});

// ----- conversation -------------------------------------------------------------------------

let replyTo: string | null = null;
/** Whether the contact panel (kind, allowed kinds, mute, verify) is open. */
let panelOpen = false;
/** The kind of what I send, per contact (send or ask), chosen in the contact panel. */
const composeKind = new Map<string, string>();
/** Files chosen in an Agent Mail composer, by contact: they survive a refresh of the view. */
const pendingFiles = new Map<string, File[]>();

/** A byte count as people read it. */
function sizeText(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(n < 10 * 1024 ? 1 : 0)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

/** A file's bytes as base64. */
async function fileBase64(f: File): Promise<string> {
  const bytes = new Uint8Array(await f.arrayBuffer());
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

/** A message's files as chips, each with a "Save…" that downloads it (never opens it). */
function attachmentChips(m: Message) {
  if (!m.attachments?.length) return null;
  return h(
    'ul',
    { class: 'attachments', 'aria-label': S.conversation.attachments },
    m.attachments.map((a) => {
      const name = a.name ?? S.conversation.unnamedFile;
      return h(
        'li',
        { class: 'chip attachment', 'data-part': String(a.part) },
        h('span', { class: 'file-name' }, name),
        h('span', { class: 'file-meta' }, ` ${a.media_type} \u00b7 ${sizeText(a.size)} `),
        h(
          'button',
          {
            type: 'button',
            class: 'small secondary save-file',
            'aria-label': S.conversation.saveFile(name),
            onclick: () => void backend.saveAttachment(m.id, a.part, name).catch((x) => say(errorText(x), true)),
          },
          S.conversation.save,
        ),
      );
    }),
  );
}
/** Set when the conversation should show its newest message after the next render. */
let scrollToNewest = true;

function messageText(m: Message): string {
  if (typeof m.body === 'string') return m.body;
  return JSON.stringify(m.body);
}

const SVG = 'http://www.w3.org/2000/svg';
/** A 16×16 line icon from path data (drawn in the text colour, hidden from screen readers). */
function icon(paths: string[], circle = false): SVGSVGElement {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', '0 0 16 16');
  svg.setAttribute('width', '16');
  svg.setAttribute('height', '16');
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('focusable', 'false');
  if (circle) {
    const c = document.createElementNS(SVG, 'circle');
    for (const [k, v] of [['cx', '8'], ['cy', '8'], ['r', '6.25']]) c.setAttribute(k, v);
    svg.appendChild(c);
  }
  for (const d of paths) {
    const p = document.createElementNS(SVG, 'path');
    p.setAttribute('d', d);
    svg.appendChild(p);
  }
  return svg;
}

/** Delivery ticks: queued a clock, relayed one check, delivered two, refused or failed a warning. */
function tick(state: string) {
  const [label, svg] = (() => {
    switch (state) {
      case 'queued':
        return [S.ticks.queued, icon(['M8 4.5V8l2.25 1.5'], true)];
      case 'relayed':
        return [S.ticks.relayed, icon(['M3 8.5l3 3 7-7.5'])];
      case 'delivered':
        return [S.ticks.delivered, icon(['M1 8.5l3 3 7-7.5', 'M7.5 11.5l7-7.5'])];
      case 'refused':
      case 'failed':
        return [state === 'refused' ? S.ticks.refused : S.ticks.failed, icon(['M8 4.5v4.25', 'M8 11v.5'], true)];
      default:
        return [state, null];
    }
  })();
  return h('span', { class: `tick tick-${state}`, title: label }, svg, h('span', { class: svg ? 'sr-only' : '' }, label));
}

/** A protocol as people read it. */
function channelLabel(protocol: string) {
  return S.channels.label[protocol] ?? protocol;
}

/** An address cut to its start and end, for a list. */
function shortAddress(a: string) {
  return a.length > 28 ? `${a.slice(0, 16)}\u2026${a.slice(-8)}` : a;
}

/** A person's channels: protocol, address, reachable or not, and a way to split one off. */
function channelList(c: Contact) {
  const channels = c.channels ?? [];
  if (!c.person || channels.length === 0) return null;
  return h(
    'section',
    { class: 'channels', 'aria-labelledby': 'channels-title' },
    h('h4', { id: 'channels-title' }, S.channels.title),
    h('p', { class: 'muted hint' }, S.channels.intro),
    h(
      'ul',
      { class: 'list' },
      channels.map((ch) =>
        h(
          'li',
          { class: 'channel', 'data-channel': ch.protocol, 'data-reachable': String(!!ch.reachable) },
          h('strong', null, channelLabel(ch.protocol)),
          ' ',
          h('code', { title: ch.address }, shortAddress(ch.address)),
          ' ',
          ch.reachable ? badge(S.channels.reachable, 'ok') : badge(S.channels.unreachable, 'danger'),
          ch.verified ? badge(S.contacts.verified, 'ok') : null,
          channels.length > 1
            ? h(
                'button',
                {
                  type: 'button',
                  class: 'small secondary',
                  'aria-label': `${S.channels.split}: ${channelLabel(ch.protocol)}`,
                  onclick: () =>
                    act(() => backend.contactSplit(c.name, ch.protocol), S.channels.splitDone(channelLabel(ch.protocol))),
                },
                S.channels.split,
              )
            : null,
        ),
      ),
    ),
  );
}

/** "Same person as …": pick another contact, then compare both safety numbers (`#/merge`). */
function mergePicker(c: Contact) {
  const others = (summary?.chats ?? []).map((x) => x.contact).filter((x) => x.name !== c.name && x.state === 'active');
  if (others.length === 0) return null;
  const pick = h('select', { id: 'merge-other' }, others.map((o) => h('option', { value: o.name }, o.name)));
  return h(
    'form',
    {
      class: 'merge',
      onsubmit: (e: Event) => {
        e.preventDefault();
        go(`#/merge/${encodeURIComponent(c.name)}/${encodeURIComponent(pick.value)}`);
      },
    },
    field(S.merge.start, pick),
    h('button', { type: 'submit', class: 'secondary small' }, S.merge.compare),
  );
}

/** The contact panel: safety, verify, mute, the kind of my messages and what they may send me. */
/** The contact's own setting for what the owner's agents write to it (null: not offered). */
function outboundField(c: Contact, outbound: { mode: OutboundMode; global: 'auto' | 'review' } | null) {
  if (!outbound) return null;
  const modes = S.conversation.outboundModes(S.conversation.outboundGlobal[outbound.global] ?? outbound.global);
  const select = h(
    'select',
    {
      id: 'contact-outbound',
      onchange: (e: Event) => {
        const mode = (e.currentTarget as HTMLSelectElement).value as OutboundMode;
        void act(() => backend.contactReview(c.name, mode), S.conversation.outboundSaved(c.name, mode));
      },
    },
    (['default', 'auto', 'review'] as const).map((m) => h('option', { value: m, selected: outbound.mode === m }, modes[m])),
  );
  return h('div', { class: 'field' }, h('label', { for: 'contact-outbound' }, S.conversation.outbound), select);
}

function contactPanel(
  c: Contact,
  kind: HTMLSelectElement,
  muteBox: Node | null,
  blocked: boolean,
  outbound: { mode: OutboundMode; global: 'auto' | 'review' } | null,
) {
  const allowBoxes = KINDS.map((k) =>
    h('label', { class: 'check' }, h('input', { type: 'checkbox', value: k, checked: (c.allow ?? []).includes(k) }), ' ', k),
  );
  return h(
    'aside',
    { class: 'contact-panel', id: 'contact-panel', role: 'complementary', 'aria-labelledby': 'panel-title', hidden: !panelOpen },
    h(
      'div',
      { class: 'panel-head' },
      h('h3', { id: 'panel-title' }, S.conversation.details(c.name)),
      h(
        'button',
        {
          type: 'button',
          class: 'small secondary',
          onclick: () => {
            panelOpen = false;
            void render(true).then(() => document.getElementById('conv-details')?.focus());
          },
        },
        S.conversation.closeDetails,
      ),
    ),
    h('p', null, contactBadges(c)),
    c.sender_auth ? h('p', { class: 'sender-auth', 'data-auth': c.sender_auth }, S.contacts.senderAuth[c.sender_auth]) : null,
    c.safety_number ? [h('p', { class: 'muted' }, S.verify.theirs(c.name)), h('p', { class: 'safety' }, c.safety_number)] : null,
    c.blocked && c.blocked_dropped ? h('p', { class: 'muted' }, S.contacts.blockedDropped(c.blocked_dropped)) : null,
    h(
      'p',
      null,
      h(
        'button',
        {
          type: 'button',
          class: 'small secondary',
          id: 'contact-block',
          'aria-label': `${c.blocked ? S.contacts.unblock : S.contacts.block} ${c.name}`,
          onclick: () =>
            act(
              () => backend.contactBlock(c.name, !c.blocked),
              c.blocked ? S.contacts.unblockedDone(c.name) : S.contacts.blockedDone(c.name),
            ),
        },
        c.blocked ? S.contacts.unblock : S.contacts.block,
      ),
    ),
    h('p', null, h('a', { href: `#/verify/${encodeURIComponent(c.name)}`, class: 'button-link small' }, S.conversation.verify)),
    channelList(c),
    mergePicker(c),
    muteBox,
    outboundField(c, outbound),
    h('div', { class: 'field' }, h('label', { for: 'compose-kind' }, S.conversation.kind), kind, h('p', { class: 'muted hint' }, S.conversation.kindHint)),
    // A person's channels keep their own allow lists (`contact allow CHANNEL`).
    c.person
      ? null
      : h(
      'form',
      {
        class: 'allow',
        onsubmit: (e: Event) => {
          e.preventDefault();
          const kinds = allowBoxes
            .map((l) => l.querySelector('input') as HTMLInputElement)
            .filter((i) => i.checked)
            .map((i) => i.value);
          void act(() => backend.contactAllow(c.name, kinds), S.settings.saved);
        },
      },
      h('fieldset', { disabled: blocked && c.key_changed }, h('legend', null, S.conversation.allowed), allowBoxes),
      h('button', { type: 'submit', class: 'secondary small' }, S.conversation.saveAllowed),
    ),
  );
}

/** The messages, oldest first, with a separator per day; one tab stop for the whole list. */
function messageList(c: Contact, msgs: Message[], blocked: boolean, onReply: (m: Message) => void, highlight?: string) {
  const byId = new Map(msgs.map((m) => [m.id, m]));
  const items: Node[] = [];
  let prev: Message | undefined;
  for (const m of msgs) {
    if (!prev || !sameLocalDay(prev.ts, m.ts)) items.push(h('li', { class: 'day' }, h('span', null, dayLabel(m.ts))));
    prev = m;
    if (m.kind === 'hello' || m.kind === 'moved') {
      // The contact request that opened the conversation, or a move to another relay: a line,
      // not a bubble (a move notice is a route change, never a message to act on).
      const line =
        m.kind === 'moved'
          ? m.direction === 'out'
            ? S.conversation.movedOut(String(m.body))
            : S.conversation.movedIn(c.name, String(m.body))
          : m.direction === 'out'
            ? S.conversation.helloOut
            : S.conversation.helloIn(c.name);
      items.push(
        h(
          'li',
          { class: `msg system ${m.direction}`, 'data-id': m.id, 'data-state': m.state, id: `msg-${m.id}` },
          line,
          ' \u00b7 ',
          h('time', { datetime: new Date(m.ts).toISOString() }, clock(m.ts)),
        ),
      );
      continue;
    }
    const parent = m.reply_to ? byId.get(m.reply_to) : undefined;
    const canReply = m.direction === 'in' && (m.kind === 'ask' || m.kind === 'send') && !blocked && c.protocol !== 'stringcup';
    items.push(
      h(
        'li',
        {
          class: `msg ${m.direction}${m.id === highlight ? ' found' : ''}${m.direction === 'in' && m.to_agent ? ' to-agent' : ''}`,
          'data-id': m.id,
          'data-state': m.state,
          id: `msg-${m.id}`,
        },
        m.from_agent || m.to_agent
          ? h(
              'p',
              { class: 'agents' },
              m.from_agent ? h('span', { class: 'chip' }, S.conversation.fromAgent(m.from_agent)) : null,
              m.to_agent && m.direction === 'in'
                ? [
                    h('span', { class: 'chip for-agent' }, S.conversation.forMyAgent(m.to_agent)),
                    m.handout
                      ? h(
                          'span',
                          { class: `chip handout handout-${m.handout.state}`, 'data-handout': m.handout.state },
                          (S.conversation.handout[m.handout.state] ?? S.conversation.notMine)(m.handout.agent),
                        )
                      : null,
                  ]
                : m.to_agent
                  ? h('span', { class: 'chip' }, S.conversation.toAgent(m.to_agent))
                  : null,
            )
          : null,
        parent ? h('blockquote', { class: 'parent' }, messageText(parent)) : null,
        h('div', { class: 'body' }, messageText(m)),
        attachmentChips(m),
        h(
          'div',
          { class: 'meta' },
          m.kind !== 'send' && m.kind !== 'reply' ? badge(S.conversation.kindBadge[m.kind] ?? m.kind, 'kind') : null,
          h('time', { datetime: new Date(m.ts).toISOString(), title: new Date(m.ts).toLocaleString() }, clock(m.ts)),
          m.direction === 'out' ? tick(m.state) : null,
          c.person ? h('span', { class: 'badge channel', 'data-channel': m.protocol }, S.channels.via(channelLabel(m.protocol))) : null,
          m.moved_from
            ? h(
                'span',
                { class: 'badge moved', title: S.channels.movedTitle(channelLabel(m.moved_from)) },
                S.channels.movedFrom(channelLabel(m.moved_from)),
              )
            : null,
          m.path === 'direct' ? h('span', { class: 'badge path-direct', title: S.conversation.directTitle }, S.conversation.direct) : null,
          m.direction === 'out' && (m.state === 'failed' || m.state === 'refused') && m.detail
            ? h('span', { class: 'detail' }, m.detail)
            : null,
        ),
        canReply
          ? h(
              'button',
              {
                type: 'button',
                class: 'small secondary reply',
                // One tab stop for the list: arrow keys move between these.
                tabindex: '-1',
                'aria-label': `${S.conversation.reply}: ${messageText(m).slice(0, 40)}`,
                onclick: () => onReply(m),
              },
              S.conversation.reply,
            )
          : null,
      ),
    );
  }
  const ol = h('ol', { class: 'messages' }, items);
  const log = h(
    'div',
    {
      class: 'message-scroll',
      id: 'message-scroll',
      role: 'log',
      tabindex: '0',
      'aria-label': S.conversation.title(c.name),
      'aria-describedby': 'log-hint',
    },
    msgs.length === 0 ? h('p', { class: 'muted chat-empty' }, S.conversation.empty) : ol,
    h('p', { class: 'sr-only', id: 'log-hint' }, S.conversation.logHint),
  );
  followNewest(log);
  // Up and down move between the messages one can answer; the list itself is one tab stop.
  log.addEventListener('keydown', (e: KeyboardEvent) => {
    if ((e.key !== 'ArrowUp' && e.key !== 'ArrowDown') || e.altKey) return;
    const buttons = [...log.querySelectorAll<HTMLButtonElement>('button.reply')];
    if (buttons.length === 0) return;
    const i = buttons.indexOf(document.activeElement as HTMLButtonElement);
    const next = i < 0 ? (e.key === 'ArrowUp' ? buttons.length - 1 : 0) : i + (e.key === 'ArrowUp' ? -1 : 1);
    const b = buttons[Math.max(0, Math.min(buttons.length - 1, next))];
    if (b) {
      e.preventDefault();
      b.focus();
    }
  });
  return log;
}

async function conversationView(name: string, highlight?: string) {
  const [contacts, msgs, muted, outboundMode, policy] = await Promise.all([
    backend.contacts(),
    backend.conversation(name),
    backend.muted().catch(() => null),
    // A person's channels keep their own setting (`contact review CHANNEL`): none offered here.
    backend.contactReview(name).catch(() => null),
    backend.policy().catch(() => null),
  ]);
  const c = contacts.find((x) => x.name === name);
  if (!c) throw new BackendError('unknown_contact', `no contact named ${name}`);
  // Shown is read (a hidden window reads nothing); the list takes this window of it.
  if (document.visibilityState === 'visible') markers().markRead(c.name, msgs);
  const chat = summary?.chats.find((x) => x.contact.name === c.name);
  if (chat) chat.msgs = msgs.slice(-LIST_WINDOW);
  // Notifications are the desktop app's: no mute switch where there are none.
  const muteKey = `c:${c.name}`;
  const muteBox =
    muted === null
      ? null
      : h(
          'div',
          { class: 'check' },
          h('input', {
            type: 'checkbox',
            id: 'conv-mute',
            checked: muted.includes(muteKey),
            onchange: (e: Event) =>
              act(() => backend.setMuted(muteKey, (e.currentTarget as HTMLInputElement).checked), S.settings.saved),
          }),
          h('label', { for: 'conv-mute' }, S.conversation.mute),
        );
  const blocked = c.key_changed || c.state !== 'active' || !!c.blocked;
  const text = h('textarea', {
    id: 'compose',
    rows: 1,
    disabled: blocked,
    required: true,
    'aria-describedby': 'compose-hint',
    placeholder: S.conversation.placeholder,
  });
  const kind = h(
    'select',
    {
      id: 'compose-kind',
      disabled: blocked,
      onchange: (e: Event) => composeKind.set(c.name, (e.currentTarget as HTMLSelectElement).value),
    },
    // Stringcup carries the text alone: no ask/reply (the runtime refuses them).
    (c.protocol === 'stringcup' ? ['send'] : ['send', 'ask']).map((k) => h('option', { value: k, selected: (composeKind.get(c.name) ?? 'send') === k }, S.conversation.kinds[k] ?? k)),
  );
  const byId = new Map(msgs.map((m) => [m.id, m]));
  const replyText = h('span', null, replyTo && byId.get(replyTo) ? S.conversation.replyTo(messageText(byId.get(replyTo) as Message)) : '');
  const replyNote = h(
    'div',
    { class: 'reply-note', hidden: !replyTo || !byId.has(replyTo) },
    replyText,
    h(
      'button',
      {
        type: 'button',
        class: 'small secondary',
        onclick: () => {
          replyTo = null;
          replyNote.hidden = true;
          text.focus();
        },
      },
      S.conversation.cancelReply,
    ),
  );
  const sendBtn = h('button', { type: 'submit', disabled: blocked }, S.conversation.send);
  // Agent Mail carries files: an "Attach" button, the chosen files as removable chips.
  const carriesFiles = c.protocol === 'agent-mail';
  const chosen = () => pendingFiles.get(c.name) ?? [];
  const fileChips = h('ul', { class: 'attachments pending', id: 'compose-files', 'aria-label': S.conversation.chosenFiles });
  const showChosen = () => {
    const files = chosen();
    text.required = files.length === 0;
    fileChips.hidden = files.length === 0;
    fileChips.replaceChildren(
      ...files.map((f, i) =>
        h(
          'li',
          { class: 'chip attachment' },
          h('span', { class: 'file-name' }, f.name),
          h('span', { class: 'file-meta' }, ` ${sizeText(f.size)} `),
          h(
            'button',
            {
              type: 'button',
              class: 'small secondary remove-file',
              'aria-label': S.conversation.removeFile(f.name),
              onclick: () => {
                pendingFiles.set(c.name, chosen().filter((_, j) => j !== i));
                showChosen();
              },
            },
            '\u00d7',
          ),
        ),
      ),
    );
  };
  const fileInput = h('input', {
    type: 'file',
    id: 'compose-file',
    multiple: true,
    hidden: true,
    onchange: (e: Event) => {
      const input = e.currentTarget as HTMLInputElement;
      pendingFiles.set(c.name, [...chosen(), ...Array.from(input.files ?? [])]);
      input.value = '';
      showChosen();
    },
  });
  const attachBtn = carriesFiles
    ? h(
        'button',
        { type: 'button', id: 'compose-attach', class: 'secondary', disabled: blocked, onclick: () => fileInput.click() },
        S.conversation.attach,
      )
    : null;
  showChosen();
  const grow = () => {
    text.style.height = 'auto';
    text.style.height = `${Math.min(text.scrollHeight + 2, 160)}px`;
  };
  text.addEventListener('input', grow);
  text.addEventListener('keydown', (e: KeyboardEvent) => {
    // Enter sends, Shift+Enter is a new line; an IME's Enter confirms its composition.
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      (text.form as HTMLFormElement | null)?.requestSubmit();
    } else if (e.key === 'Escape' && replyTo) {
      replyTo = null;
      replyNote.hidden = true;
    }
  });
  const onReply = (m: Message) => {
    replyTo = m.id;
    replyText.textContent = S.conversation.replyTo(messageText(m));
    replyNote.hidden = false;
    text.focus();
  };
  return h(
    'section',
    { class: 'conversation', 'data-contact': c.name, 'aria-labelledby': 'conv-title' },
    h(
      'div',
      { class: 'conv-head' },
      h('a', { href: '#/contacts', class: 'back', 'aria-label': S.conversation.back }, '‹'),
      h('h2', { id: 'conv-title' }, h('span', { class: 'sr-only' }, S.conversation.titlePrefix), c.name),
      h('span', { class: 'conv-badges' }, contactBadges(c)),
      h('a', { href: `#/verify/${encodeURIComponent(c.name)}`, class: 'button-link small secondary-link' }, S.conversation.verify),
      h(
        'button',
        {
          type: 'button',
          id: 'conv-details',
          class: 'small secondary',
          'aria-expanded': String(panelOpen),
          'aria-controls': 'contact-panel',
          onclick: () => {
            panelOpen = !panelOpen;
            void render(true).then(() => {
              if (panelOpen) document.getElementById('panel-title')?.parentElement?.querySelector('button')?.focus();
            });
          },
        },
        S.conversation.detailsButton,
      ),
    ),
    c.key_changed
      ? h(
          'div',
          { class: 'banner danger', role: 'alert' },
          S.keyChange.banner(c.name),
          ' ',
          h('a', { href: `#/verify/${encodeURIComponent(c.name)}` }, S.keyChange.action),
        )
      : c.blocked
        ? h('div', { class: 'banner', role: 'alert' }, S.contacts.blockedBanner)
        : c.state !== 'active'
          ? h('div', { class: 'banner', role: 'alert' }, S.conversation.blockedPending)
          : null,
    h(
      'div',
      { class: 'conv-body' },
      messageList(c, msgs, blocked, onReply, highlight),
      contactPanel(c, kind, muteBox, blocked, outboundMode && policy && !c.person ? { mode: outboundMode, global: policy.review } : null),
    ),
    h(
      'form',
      {
        class: 'compose',
        onsubmit: (e: Event) => {
          e.preventDefault();
          const files = carriesFiles ? chosen() : [];
          void submitComposer(
            text,
            sendBtn,
            async (body) => {
              if (files.length > 0) {
                const parts = await Promise.all(files.map(async (f) => ({ name: f.name, media_type: null, data: await fileBase64(f) })));
                await backend.mailSend(c.name, body, parts, { reply_to: replyTo ?? undefined });
                pendingFiles.delete(c.name);
              } else {
                await backend.send(c.name, body, {
                  kind: replyTo ? 'reply' : kind.value,
                  reply_to: replyTo ?? undefined,
                });
              }
              replyTo = null;
            },
            files.length > 0,
          );
        },
      },
      replyNote,
      carriesFiles ? fileChips : null,
      h(
        'div',
        { class: 'compose-row' },
        h('label', { for: 'compose', class: 'sr-only' }, S.conversation.compose),
        text,
        carriesFiles ? fileInput : null,
        attachBtn,
        sendBtn,
      ),
      h('p', { class: 'hint', id: 'compose-hint' }, S.conversation.hint),
    ),
  );
}

// ----- verification -------------------------------------------------------------------------

async function verifyView(name: string) {
  const [contacts, who] = await Promise.all([backend.contacts(), backend.whoami()]);
  const c = contacts.find((x) => x.name === name);
  if (!c) throw new BackendError('unknown_contact', `no contact named ${name}`);
  // A person's one safety number pairs with ours from our contact link.
  const mine = identities(who).find(([p]) => p === (c.person ? 'contact_link' : c.protocol))?.[1];
  const myNumber = mine?.safety_number ?? mine?.fingerprint_short ?? '';
  const theirs = c.key_changed ? (c.new_safety_number ?? '') : (c.safety_number ?? '');
  const theirLabel = c.key_changed ? S.verify.theirsNew(c.name) : S.verify.theirs(c.name);
  return h(
    'div',
    { class: 'verify' },
    h('p', null, h('a', { href: `#/c/${encodeURIComponent(c.name)}` }, S.conversation.back)),
    h('h2', null, S.verify.title(c.name), ' ', contactBadges(c)),
    c.key_changed ? h('div', { class: 'banner danger', role: 'alert' }, S.keyChange.banner(c.name)) : null,
    h('p', null, S.verify.intro),
    h(
      'div',
      { class: 'side-by-side' },
      h(
        'section',
        { class: 'card', 'aria-label': S.verify.yours },
        h('h3', null, S.verify.yours),
        h('p', { class: 'safety big', 'data-who': 'me' }, myNumber),
        myNumber ? qr(myNumber, S.verify.qr(S.verify.yours)) : null,
      ),
      h(
        'section',
        { class: 'card', 'aria-label': theirLabel },
        h('h3', null, theirLabel),
        h('p', { class: 'safety big', 'data-who': 'them' }, theirs),
        theirs ? qr(theirs, S.verify.qr(theirLabel)) : null,
      ),
    ),
    h(
      'button',
      {
        type: 'button',
        onclick: () =>
          act(async () => {
            await backend.contactVerify(c.name);
            go(`#/c/${encodeURIComponent(c.name)}`);
          }, S.verify.done),
      },
      S.verify.mark,
    ),
  );
}

/** Two contacts' safety numbers side by side; "They are the same person" merges `other` into
 * `name` (the runtime checks the number the owner saw is still `other`'s). */
async function mergeView(name: string, other: string) {
  const contacts = await backend.contacts();
  const a = contacts.find((x) => x.name === name);
  const b = contacts.find((x) => x.name === other);
  if (!a || !b) throw new BackendError('unknown_contact', `no contact named ${a ? other : name}`);
  const card = (c: Contact, who: string) =>
    h(
      'section',
      { class: 'card', 'aria-label': S.verify.theirs(c.name) },
      h('h3', null, S.verify.theirs(c.name), ' ', contactBadges(c)),
      h('p', { class: 'safety big', 'data-who': who }, c.safety_number ?? ''),
      c.safety_number ? qr(c.safety_number, S.verify.qr(S.verify.theirs(c.name))) : null,
    );
  return h(
    'div',
    { class: 'verify merge' },
    h('p', null, h('a', { href: `#/c/${encodeURIComponent(a.name)}` }, S.conversation.back)),
    h('h2', null, S.merge.title(a.name, b.name)),
    h('p', null, S.merge.intro),
    h('div', { class: 'side-by-side' }, card(a, 'first'), card(b, 'second')),
    h(
      'button',
      {
        type: 'button',
        onclick: () =>
          act(async () => {
            await backend.contactMerge(a.name, b.name, b.safety_number ?? '');
            go(`#/c/${encodeURIComponent(a.name)}`);
          }, S.merge.done(a.name)),
      },
      S.merge.same,
    ),
  );
}

// ----- agents, review, log, settings, me ----------------------------------------------------

async function agentsView() {
  const st = await backend.status();
  return h(
    'div',
    null,
    h('h2', null, S.agents.title),
    st.agents.length === 0
      ? h('p', { class: 'muted' }, S.agents.empty)
      : h(
          'table',
          null,
          h(
            'thead',
            null,
            h(
              'tr',
              null,
              [S.agents.name, S.agents.harness, S.agents.status, S.agents.where, S.agents.updated].map((t) =>
                h('th', { scope: 'col' }, t),
              ),
            ),
          ),
          h(
            'tbody',
            null,
            st.agents.map((a) =>
              h(
                'tr',
                null,
                h('td', null, a.name),
                h('td', null, a.harness),
                h('td', null, badge(a.status)),
                h('td', null, a.where),
                h('td', null, fmtTime(a.updated_at)),
              ),
            ),
          ),
        ),
    h('h2', null, S.status.title),
    h(
      'dl',
      null,
      h('dt', null, S.status.pid),
      h('dd', null, String(st.pid)),
      h('dt', null, S.status.profile),
      h('dd', null, st.profile),
      h('dt', null, S.status.keystore),
      h('dd', null, st.keystore),
      h('dt', null, S.status.outbox),
      h('dd', null, String(st.outbox)),
      h('dt', null, S.status.bridge),
      h('dd', null, st.bridge ?? '—'),
    ),
  );
}

/** The last invite link made in this window (kept across refreshes); its state comes from the runtime. */
let lastInvite: { group: string; invite: string; link: string; expires_at: number } | null = null;
let countdown: ReturnType<typeof setInterval> | undefined;

/** Makes an invite link to `group` and shows it. */
async function newInvite(group: string) {
  const inv = await backend.groupInvite(group);
  lastInvite = { group, invite: inv.invite, link: inv.link, expires_at: inv.expires_at };
}

/**
 * The invite link of `group`, if one was made here: while it waits, the link, its QR code and the
 * time left; once used (it is single-use), who joined with it, and no countdown.
 */
function inviteBox(group: string, invites: InviteStatus[]) {
  clearInterval(countdown);
  if (!lastInvite || lastInvite.group !== group) return null;
  const inv = lastInvite;
  const st = invites.find((i) => i.invite === inv.invite);
  const state = st?.state ?? (Date.now() < inv.expires_at ? 'waiting' : 'expired');
  const head = h('h4', null, S.groups.invite);
  if (state !== 'waiting') {
    const text =
      state === 'used' ? S.groups.inviteUsed(st?.joined || S.groups.someone) : state === 'expired' ? S.groups.inviteExpired : S.groups.inviteFailed;
    return h('section', { class: 'invite used', 'aria-label': S.groups.invite, 'data-state': state }, head, h('p', null, text));
  }
  const left = h('span', { class: 'countdown', 'aria-live': 'off' });
  const tickDown = () => (left.textContent = S.groups.expiresIn(Math.max(0, Math.round((inv.expires_at - Date.now()) / 1000))));
  tickDown();
  countdown = setInterval(tickDown, 1000);
  return h(
    'section',
    { class: 'invite', 'aria-label': S.groups.invite, 'data-state': state },
    head,
    h('p', { class: 'muted hint' }, S.groups.inviteHint),
    h('code', { class: 'address' }, inv.link),
    ' ',
    copyButton(inv.link),
    h('p', null, left),
    qr(inv.link, S.groups.invite),
  );
}

/** Whether the group panel (name, members, invite, mute, policy) is open. */
let groupPanelOpen = false;

/** The group's details: its name, invite link, members with fingerprints, mute and policy. */
function groupPanel(g: GroupSummary, members: GroupMember[] | null, invites: InviteStatus[], muted: string[] | null) {
  const nameInput = h('input', { type: 'text', id: 'group-name', maxlength: 64, required: true, value: groupName(g) });
  const muteKey = groupKey(g.group);
  const modeSelect = h(
    'select',
    {
      id: 'group-mode',
      onchange: (e: Event) => act(() => backend.groupMode(g.group, (e.currentTarget as HTMLSelectElement).value), S.groups.modeSaved),
    },
    ['default', 'auto', 'review'].map((m) => h('option', { value: m, selected: (g.mode ?? 'default') === m }, S.groups.modes[m])),
  );
  const lg = g.loop_guard;
  return h(
    'aside',
    { class: 'contact-panel', id: 'group-panel', role: 'complementary', 'aria-labelledby': 'panel-title', hidden: !groupPanelOpen },
    h(
      'div',
      { class: 'panel-head' },
      h('h3', { id: 'panel-title' }, S.groups.details),
      h(
        'button',
        {
          type: 'button',
          class: 'small secondary',
          onclick: () => {
            groupPanelOpen = false;
            void render(true).then(() => document.getElementById('conv-details')?.focus());
          },
        },
        S.conversation.closeDetails,
      ),
    ),
    h(
      'form',
      {
        class: 'rename',
        onsubmit: (e: Event) => {
          e.preventDefault();
          void act(() => backend.groupRename(g.group, nameInput.value), S.groups.renamed);
        },
      },
      field(S.groups.nameField, nameInput),
      h('p', { class: 'muted hint' }, S.groups.nameHint),
      h('button', { type: 'submit', class: 'secondary small' }, S.groups.rename),
    ),
    g.state === 'active'
      ? h('p', null, h('button', { type: 'button', onclick: () => act(() => newInvite(g.group)) }, S.groups.inviteTo))
      : null,
    inviteBox(g.group, invites),
    members
      ? h(
          'table',
          { class: 'members' },
          h('caption', null, S.groups.membersCount(members.length)),
          h('thead', null, h('tr', null, [S.groups.name, S.groups.fingerprint, S.groups.invitedBy].map((t) => h('th', { scope: 'col' }, t)))),
          h(
            'tbody',
            null,
            members.map((m) =>
              h(
                'tr',
                null,
                h('td', null, m.name, m.you ? ` ${S.groups.you}` : ''),
                h('td', { class: 'safety' }, m.fingerprint),
                h('td', null, m.invited_by ? m.invited_by.replace(/ \(.*\)$/, '') : '—'),
              ),
            ),
          ),
        )
      : null,
    muted === null
      ? null
      : h(
          'div',
          { class: 'check' },
          h('input', {
            type: 'checkbox',
            id: 'group-mute',
            checked: muted.includes(muteKey),
            onchange: (e: Event) => act(() => backend.setMuted(muteKey, (e.currentTarget as HTMLInputElement).checked), S.settings.saved),
          }),
          h('label', { for: 'group-mute' }, S.groups.mute),
        ),
    h('div', { class: 'field group-policy' }, h('label', { for: 'group-mode' }, S.groups.mode), modeSelect),
    lg?.paused
      ? h(
          'p',
          { class: 'banner', role: 'status' },
          S.groups.paused(lg.hops, lg.held),
          ' ',
          h('button', { type: 'button', onclick: () => act(() => backend.groupResume(g.group), S.groups.resumed) }, S.groups.resume),
        )
      : null,
  );
}

/** A group's messages, oldest first: members' messages as bubbles with the sender's name, membership
 * changes and alerts as lines; one tab stop for the list. */
/**
 * The member an @mention in `text` addresses (the longest member name written as `@name`, not
 * oneself), as the group protocol carries one addressee.
 */
function mentionOf(text: string, members: GroupMember[] | null): GroupMember | undefined {
  const lower = text.toLowerCase();
  const named = (members ?? []).filter((m) => !m.you && m.name).sort((a, b) => b.name.length - a.name.length);
  return named.find((m) => {
    const at = lower.indexOf(`@${m.name.toLowerCase()}`);
    if (at < 0) return false;
    const after = lower.charAt(at + m.name.length + 1);
    return after === '' || !/[\p{L}\p{N}_]/u.test(after);
  });
}

function groupMessageList(name: string, msgs: GroupMessage[], members: GroupMember[] | null) {
  const items: Node[] = [];
  let prev: GroupMessage | undefined;
  for (const m of msgs) {
    const newDay = !prev || !sameLocalDay(prev.at, m.at);
    if (newDay) items.push(h('li', { class: 'day' }, h('span', null, dayLabel(m.at))));
    const time = h('time', { datetime: new Date(m.at).toISOString(), title: new Date(m.at).toLocaleString() }, clock(m.at));
    if (m.kind !== 'message') {
      items.push(
        h(
          'li',
          { class: `msg system${m.kind === 'alert' ? ' alert' : ''}`, 'data-id': m.id, id: `msg-${m.row}` },
          m.kind === 'alert' ? S.groups.alert(m.content) : eventText(m),
          ' \u00b7 ',
          time,
        ),
      );
      prev = m;
      continue;
    }
    // The sender's name heads a run of their messages, as in any group chat.
    const sameRun = !newDay && prev?.kind === 'message' && !prev.outgoing && !m.outgoing && prev.from.fingerprint === m.from.fingerprint;
    // An @mention: the member it addresses, named; one addressed to me stands out.
    const to = m.to ? (members ?? []).find((x) => x.fingerprint === m.to) : undefined;
    const toMe = !!to?.you;
    items.push(
      h(
        'li',
        { class: `msg ${m.outgoing ? 'out' : 'in'}${toMe ? ' mention' : ''}`, 'data-id': m.id, 'data-state': m.state, id: `msg-${m.row}` },
        !m.outgoing && !sameRun ? h('p', { class: 'sender' }, m.from.name) : null,
        to
          ? h(
              'p',
              { class: 'agents' },
              h('span', { class: `chip mention-chip${toMe ? ' to-me' : ''}`, title: S.groups.mentionTitle(to.name) }, toMe ? S.groups.mentionsYou : `@${to.name}`),
            )
          : null,
        h('div', { class: 'body' }, m.content),
        h(
          'div',
          { class: 'meta' },
          time,
          m.outgoing ? tick(m.state === 'done' ? 'relayed' : 'queued') : null,
        ),
      ),
    );
    prev = m;
  }
  const log = h(
    'div',
    { class: 'message-scroll', id: 'message-scroll', role: 'log', tabindex: '0', 'aria-label': S.groups.log(name) },
    msgs.length === 0 ? h('p', { class: 'muted chat-empty' }, S.groups.noMessages) : h('ol', { class: 'messages' }, items),
  );
  followNewest(log);
  return log;
}

/**
 * Sends what the composer holds. The text leaves the composer at once: a background refresh that
 * lands while the send is under way replaces the composer and carries over what it holds, so
 * clearing only after the send would leave the sent text in the new composer (and Enter pressed
 * again would send it twice). If the send fails, the text comes back unless something new was typed.
 */
async function submitComposer(
  text: HTMLTextAreaElement,
  sendBtn: HTMLButtonElement,
  send: (body: string) => Promise<unknown>,
  hasFiles = false,
) {
  const body = text.value;
  if (!body.trim() && !hasFiles) return;
  // The composer on screen now: the one this form was built with, or its replacement.
  const current = () => (document.getElementById('compose') as HTMLTextAreaElement | null) ?? text;
  const clear = (el: HTMLTextAreaElement, value: string) => {
    el.value = value;
    el.dispatchEvent(new Event('input')); // it shrinks or grows with what it holds
  };
  clear(text, '');
  if (current() !== text) clear(current(), '');
  sendBtn.disabled = true;
  try {
    await send(body);
    scrollToNewest = true;
    await render(true);
    document.getElementById('compose')?.focus();
  } catch (x) {
    const el = current();
    if (!el.value) clear(el, body);
    say(errorText(x), true);
    sendBtn.disabled = false;
    const shown = el.form?.querySelector<HTMLButtonElement>('button[type="submit"]');
    if (shown) shown.disabled = false;
  }
}

/** A group as a chat: its messages, the composer (as the person's own group session), the details. */
async function groupView(group: string) {
  const s = summary ?? (await refreshSummary());
  const gc = s.groups.find((x) => x.g.group === group);
  if (!gc) throw new BackendError('unknown_group', `not in group ${group}`);
  const g = gc.g;
  const visible = document.visibilityState === 'visible';
  const [hist, members, invites, muted] = await Promise.all([
    backend.groupHistory(group, 500, visible),
    backend
      .groupMembers(group)
      .then((x) => x.members)
      .catch(() => null),
    backend.groupInvites().catch(() => [] as InviteStatus[]),
    backend.muted().catch(() => null),
  ]);
  // Shown is read (a hidden window reads nothing).
  if (visible) markers().markRead(groupKey(group), readable(hist.messages));
  gc.msgs = hist.messages.slice(-LIST_WINDOW);
  const name = groupName(g);
  const blocked = g.state !== 'active';
  const text = h('textarea', {
    id: 'compose',
    rows: 1,
    disabled: blocked,
    required: true,
    'aria-describedby': 'compose-hint',
    placeholder: S.groups.placeholder(name),
  });
  const sendBtn = h('button', { type: 'submit', disabled: blocked }, S.conversation.send);
  text.addEventListener('input', () => {
    text.style.height = 'auto';
    text.style.height = `${Math.min(text.scrollHeight + 2, 160)}px`;
  });
  text.addEventListener('keydown', (e: KeyboardEvent) => {
    // Enter sends, Shift+Enter is a new line; an IME's Enter confirms its composition.
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      (text.form as HTMLFormElement | null)?.requestSubmit();
    }
  });
  return h(
    'section',
    { class: 'conversation group-chat', 'data-group': group, 'aria-labelledby': 'conv-title' },
    h(
      'div',
      { class: 'conv-head' },
      h('a', { href: '#/contacts', class: 'back', 'aria-label': S.conversation.back }, '‹'),
      h('h2', { id: 'conv-title' }, h('span', { class: 'sr-only' }, S.groups.titlePrefix), name),
      h('span', { class: 'conv-badges muted' }, members ? S.groups.membersCount(members.length) : ''),
      h(
        'button',
        {
          type: 'button',
          id: 'conv-details',
          class: 'small secondary',
          'aria-expanded': String(groupPanelOpen),
          'aria-controls': 'group-panel',
          onclick: () => {
            groupPanelOpen = !groupPanelOpen;
            void render(true).then(() => {
              if (groupPanelOpen) document.getElementById('group-name')?.focus();
            });
          },
        },
        S.conversation.detailsButton,
      ),
    ),
    blocked ? h('div', { class: 'banner', role: 'alert' }, S.groups.inactive(g.state)) : null,
    h('div', { class: 'conv-body' }, groupMessageList(name, hist.messages, members), groupPanel(g, members, invites, muted)),
    h(
      'form',
      {
        class: 'compose',
        onsubmit: (e: Event) => {
          e.preventDefault();
          void submitComposer(text, sendBtn, (body) => backend.groupSend(group, body, mentionOf(body, members)?.fingerprint));
        },
      },
      h(
        'div',
        { class: 'compose-row' },
        h('label', { for: 'compose', class: 'sr-only' }, S.groups.compose(name)),
        text,
        sendBtn,
      ),
      h('p', { class: 'hint', id: 'compose-hint' }, S.groups.hint),
    ),
  );
}

/** The Groups screen: a new group by name, and every group as a link to its chat. */
async function groupsView() {
  const s = summary ?? (await refreshSummary());
  const nameInput = h('input', { type: 'text', id: 'new-group-name', maxlength: 64, required: true, autocomplete: 'off' });
  const create = h(
    'form',
    {
      class: 'paste-form',
      'aria-labelledby': 'new-group-title',
      onsubmit: (e: Event) => {
        e.preventDefault();
        void act(async () => {
          const made = await backend.groupCreate(nameInput.value);
          await newInvite(made.group);
          groupPanelOpen = true;
          go(`#/g/${encodeURIComponent(made.group)}`);
        }, S.groups.created(nameInput.value.trim()));
      },
    },
    h('h3', { id: 'new-group-title' }, S.groups.newGroup),
    h('div', { class: 'inline-field' }, field(S.groups.nameField, nameInput), h('button', { type: 'submit' }, S.groups.create)),
    h('p', { class: 'muted hint' }, S.groups.createHint),
  );
  const sorted = [...s.groups].sort((a, b) => (groupActivity(b) ?? 0) - (groupActivity(a) ?? 0));
  return h(
    'div',
    { class: 'groups' },
    h('h2', null, S.groups.title),
    h('p', null, S.groups.intro),
    create,
    sorted.length === 0
      ? h('p', { class: 'muted' }, S.groups.empty)
      : h('ul', { class: 'chats-ul', 'aria-label': S.groups.title }, sorted.map((g) => groupItem(g, null))),
  );
}

/**
 * Contacts by id and by name, as the person knows them: a person's channel (its own contact row,
 * named like `Bob.letagents`, with the channel's own id) maps to the person's name, since the
 * activity log and the review queue name the channel that carried a message.
 */
function contactNames(): { byId: Map<string, string>; byName: Map<string, string> } {
  const byId = new Map<string, string>();
  const byName = new Map<string, string>();
  const add = (x: Contact, name: string) => {
    byId.set(x.id, name);
    byName.set(x.name, name);
    // Agent Mail's delivery rows name the recipient's mailbox (`…/mail/MAILBOX?route=…`).
    const mailbox = /\/mail\/([A-Za-z0-9_-]+)/.exec(x.address ?? '')?.[1];
    if (mailbox) byId.set(mailbox, name);
  };
  for (const c of [...(summary?.chats ?? []).map((x) => x.contact), ...(summary?.requests ?? [])]) {
    add(c, c.name);
    for (const ch of c.channels ?? []) add(ch, c.name);
  }
  return { byId, byName };
}

function reviewTarget(it: ReviewItem): string {
  if (it.asnet) return S.review.asnetTarget;
  if (typeof it.group === 'string' && it.group) {
    const g = summary?.groups.find((x) => x.g.group === it.group)?.g;
    return S.review.toGroup(groupName(g), it.to ?? null);
  }
  if (!it.contact) return '?';
  return contactNames().byName.get(it.contact) ?? it.contact;
}

/** Review items whose text is open for editing (kept across background refreshes). */
const editing = new Set<number>();

/** A held message's text, or the form that edits it before it is approved. */
function reviewText(it: ReviewItem, target: string) {
  if (!editing.has(it.id)) return h('blockquote', { class: 'review-text' }, it.text);
  const fieldId = `review-edit-${it.id}`;
  const text = h('textarea', { id: fieldId, rows: 4, required: true }, it.text);
  return h(
    'form',
    {
      class: 'review-edit',
      onsubmit: (e: Event) => {
        e.preventDefault();
        const edited = text.value;
        void act(async () => {
          await backend.reviewDecide(it.id, true, edited === it.text ? undefined : edited);
          editing.delete(it.id);
        }, S.review.approvedEdited(target));
      },
    },
    h('label', { for: fieldId }, S.review.editLabel),
    text,
    h(
      'div',
      { class: 'actions' },
      h('button', { type: 'submit', 'aria-label': `${S.review.approveEdited}: ${it.agent} \u2192 ${target}` }, S.review.approveEdited),
      h(
        'button',
        {
          type: 'button',
          class: 'secondary',
          onclick: () => {
            editing.delete(it.id);
            void render(true);
          },
        },
        S.review.cancelEdit,
      ),
    ),
  );
}

async function reviewView() {
  const [items, policy] = await Promise.all([backend.reviewList(), backend.policy().catch(() => null)]);
  return h(
    'div',
    { class: 'review' },
    h('h2', null, S.review.title),
    h(
      'p',
      null,
      policy?.review === 'review' ? S.review.onIntro : S.review.offIntro,
      ' ',
      h('a', { href: '#/settings' }, S.review.change),
    ),
    items.length === 0
      ? h('p', { class: 'muted' }, S.review.empty)
      : h(
          'ul',
          { class: 'list review-list' },
          items.map((it) => {
            const target = reviewTarget(it);
            const headId = `review-${it.id}`;
            return h(
              'li',
              { class: 'card review-item', 'aria-labelledby': headId, 'data-review': String(it.id) },
              h(
                'p',
                { class: 'review-head', id: headId },
                h('strong', null, `${it.agent} \u2192 ${target}`),
                ', ',
                h('time', { datetime: new Date(it.created_at).toISOString(), title: new Date(it.created_at).toLocaleString() }, ago(it.created_at)),
              ),
              h(
                'p',
                { class: 'review-tags' },
                it.asnet
                  ? h('span', { class: 'chip' }, S.review.asnetChip)
                  : it.kind !== 'send'
                    ? h('span', { class: 'chip' }, S.conversation.kindBadge[it.kind] ?? it.kind)
                    : null,
                it.to_agent ? h('span', { class: 'chip' }, S.conversation.toAgent(it.to_agent)) : null,
              ),
              it.asnet
                ? h(
                    'div',
                    { class: 'review-text' },
                    h('p', null, S.review.asnetIntro),
                    h('p', null, h('strong', null, S.review.asnetAction(it.asnet.action))),
                    it.asnet.expires_at ? h('p', { class: 'muted' }, S.review.asnetExpires(ago(it.asnet.expires_at))) : null,
                  )
                : reviewText(it, target),
              editing.has(it.id)
                ? null
                : h(
                'div',
                { class: 'actions' },
                h(
                  'button',
                  {
                    type: 'button',
                    'aria-label': `${S.review.approve}: ${it.agent} \u2192 ${target}`,
                    onclick: () =>
                      act(() => backend.reviewDecide(it.id, true), it.asnet ? S.review.asnetApproved : S.review.approved(target)),
                  },
                  S.review.approve,
                ),
                h(
                  'button',
                  {
                    type: 'button',
                    class: 'secondary',
                    'aria-label': `${S.review.reject}: ${it.agent} \u2192 ${target}`,
                    onclick: () => act(() => backend.reviewDecide(it.id, false), S.review.rejected),
                  },
                  S.review.reject,
                ),
                // An ASNET challenge is confirmed exactly as asked: no edit.
                it.asnet
                  ? null
                  : h(
                      'button',
                      {
                        type: 'button',
                        class: 'secondary',
                        'aria-label': `${S.review.edit}: ${it.agent} \u2192 ${target}`,
                        onclick: () => {
                          editing.add(it.id);
                          void render(true).then(() => document.getElementById(`review-edit-${it.id}`)?.focus());
                        },
                      },
                      S.review.edit,
                    ),
              ),
            );
          }),
        ),
  );
}

let logSearch = '';

function download(name: string, type: string, data: string) {
  const url = URL.createObjectURL(new Blob([data], { type }));
  const a = h('a', { href: url, download: name });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function csv(rows: AuditRow[]): string {
  const q = (v: unknown) => `"${String(v).replace(/"/g, '""')}"`;
  const cols: (keyof AuditRow)[] = ['id', 'at', 'direction', 'protocol', 'peer', 'message_id', 'kind', 'state', 'detail'];
  return [cols.join(','), ...rows.map((r) => cols.map((c) => q(r[c])).join(','))].join('\n');
}

async function logView() {
  const rows = await backend.log(logSearch || undefined);
  // Peers by their contact names where they are contacts (a person's channels by the person's).
  const names = contactNames().byId;
  const search = h('input', { type: 'search', id: 'log-search', value: logSearch });
  let timer: ReturnType<typeof setTimeout> | undefined;
  search.addEventListener('input', () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      logSearch = search.value;
      void render(true);
    }, 250);
  });
  return h(
    'div',
    null,
    h('h2', null, S.log.title),
    h(
      'div',
      { class: 'toolbar' },
      field(S.log.search, search),
      h('button', { type: 'button', onclick: () => download('switchboard-log.json', 'application/json', JSON.stringify(rows, null, 2)) }, S.log.export),
      h('button', { type: 'button', class: 'secondary', onclick: () => download('switchboard-log.csv', 'text/csv', csv(rows)) }, S.log.exportCsv),
    ),
    rows.length === 0
      ? h('p', { class: 'muted' }, S.log.empty)
      : h(
          'table',
          { class: 'log' },
          h('thead', null, h('tr', null, S.log.cols.map((t) => h('th', { scope: 'col' }, t)))),
          h(
            'tbody',
            null,
            // Newest first, as a person reads a log (the export keeps the runtime's order).
            [...rows].reverse().map((r) =>
              h(
                'tr',
                null,
                h('td', null, h('time', { datetime: new Date(r.at).toISOString(), title: new Date(r.at).toLocaleString() }, shortTime(r.at))),
                h('td', null, r.direction),
                h('td', null, protocolBadge(r.protocol)),
                h('td', null, names.get(r.peer) ?? (r.peer ? h('code', null, r.peer.slice(0, 12)) : '—')),
                h('td', null, r.kind),
                h('td', null, badge(r.state, `state state-${r.state}`)),
                h('td', null, r.path === 'direct' ? `${r.detail ? `${r.detail} · ` : ''}${S.conversation.direct}` : r.detail),
              ),
            ),
          ),
        ),
  );
}

async function settingsView() {
  const [st, prefs, hosted, policy] = await Promise.all([
    backend.status(),
    backend.settings(),
    backend.hostedRelay().catch(() => null),
    backend.policy().catch(() => null),
  ]);
  const reviewBox = h('input', {
    type: 'checkbox',
    id: 'set-review',
    checked: policy?.review === 'review',
    disabled: policy === null,
    'aria-describedby': 'set-review-note',
    onchange: (e: Event) => {
      const on = (e.currentTarget as HTMLInputElement).checked;
      void act(() => backend.policy(on ? 'review' : 'auto'), on ? S.settings.reviewOn : S.settings.reviewOff);
    },
  });
  const lanBox = h('input', {
    type: 'checkbox',
    id: 'set-lan',
    checked: st.lan?.enabled ?? false,
    disabled: st.lan === undefined,
    'aria-describedby': 'set-lan-note',
    onchange: (e: Event) => {
      const on = (e.currentTarget as HTMLInputElement).checked;
      void act(() => backend.lan(on), on ? S.settings.lanOn : S.settings.lanOff);
    },
  });
  const toggle = (key: string, label: string) => {
    const id = `set-${key}`;
    const box = h('input', {
      type: 'checkbox',
      id,
      checked: prefs?.[key] ?? false,
      disabled: prefs === null,
      onchange: (e: Event) =>
        act(() => backend.setSetting(key, (e.currentTarget as HTMLInputElement).checked), S.settings.saved),
    });
    return h('div', { class: 'check' }, box, h('label', { for: id }, label));
  };
  const themeSelect = h(
    'select',
    {
      id: 'set-theme',
      onchange: (e: Event) => {
        setTheme((e.currentTarget as HTMLSelectElement).value as Theme);
        say(S.settings.saved);
      },
    },
    (['system', 'light', 'dark'] as Theme[]).map((t) => h('option', { value: t, selected: theme() === t }, S.settings.themes[t])),
  );
  return h(
    'div',
    null,
    h('h2', null, S.settings.title),
    h(
      'section',
      { 'aria-labelledby': 'appearance-title' },
      h('h3', { id: 'appearance-title' }, S.settings.appearance),
      field(S.settings.theme, themeSelect),
    ),
    h(
      'section',
      { 'aria-labelledby': 'review-title' },
      h('h3', { id: 'review-title' }, S.settings.review),
      h('div', { class: 'check' }, reviewBox, h('label', { for: 'set-review' }, S.settings.reviewMode)),
      h('p', { class: 'muted hint', id: 'set-review-note' }, S.settings.reviewNote),
    ),
    h(
      'section',
      { 'aria-labelledby': 'relays-title' },
      h('h3', { id: 'relays-title' }, S.settings.relays),
      h(
        'table',
        null,
        h('thead', null, h('tr', null, S.settings.relayColumns.map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', null, st.relays.map(relayRow)),
      ),
    ),
    relayMoveBox(st.relays.find((r) => r.own)?.url ?? ''),
    hosted ? hostedRelayBox(hosted) : null,
    h(
      'section',
      { 'aria-labelledby': 'lan-title' },
      h('h3', { id: 'lan-title' }, S.settings.lan),
      h('div', { class: 'check' }, lanBox, h('label', { for: 'set-lan' }, S.settings.lanMode)),
      h('p', { class: 'muted hint', id: 'set-lan-note' }, S.settings.lanNote),
      st.lan?.running ? h('p', null, S.settings.lanNearby(st.lan.nearby)) : null,
    ),
    h(
      'section',
      { 'aria-labelledby': 'asnet-title' },
      h('h3', { id: 'asnet-title' }, S.asnet.settingsTitle),
      h('p', { class: 'muted hint' }, S.asnet.settingsNote),
      h('p', null, h('a', { href: '#/network' }, S.asnet.settingsOpen)),
    ),
    h(
      'section',
      { 'aria-labelledby': 'notif-title' },
      h('h3', { id: 'notif-title' }, S.settings.notifications),
      toggle('notifications', S.settings.notify),
      toggle('do_not_disturb', S.settings.dnd),
    ),
    h(
      'section',
      { 'aria-labelledby': 'tray-title' },
      h('h3', { id: 'tray-title' }, S.settings.tray),
      prefs === null ? h('p', { class: 'muted' }, S.settings.trayOnlyDesktop) : null,
      toggle('close_to_tray', S.settings.closeToTray),
      toggle('start_in_tray', S.settings.startInTray),
    ),
    h(
      'section',
      { 'aria-labelledby': 'keys-title' },
      h('h3', { id: 'keys-title' }, S.settings.shortcuts),
      h('dl', { class: 'shortcuts' }, S.settings.shortcutList.map(([k, what]) => [h('dt', null, k), h('dd', null, what)])),
    ),
  );
}

/** The move form's state: kept outside the form, so a background refresh of Settings (a
 * message arriving, the relay's health changing) redraws the confirmation and the answer rather
 * than dropping them. */
const moveForm: {
  confirm: { to: string; pin: string | undefined; plan: MovePlan } | null;
  out: { cls: string; text: string };
  busy: boolean;
  /** Redraws the form now on screen from this state. */
  paint: () => void;
} = { confirm: null, out: { cls: '', text: '' }, busy: false, paint: () => {} };

/** Settings → Move to another relay: the runtime says what the move will do (contacts told,
 * groups that stay, how long the old relay is read), the person confirms, then the runtime checks
 * the relay answers and moves; its answer (or refusal) is shown under the form. */
/** One relay in Settings: its URL, what the profile uses it for, and the connection (the live
 * one for its own relay; the others are read on a timer). */
function relayRow(r: RelayStatus) {
  const uses: string[] = [];
  if (r.own) {
    uses.push(S.settings.relayOwn);
    if (r.people) uses.push(S.settings.relayPeople(r.people));
  } else if (r.drain_until) {
    uses.push(S.settings.relayDraining(new Date(r.drain_until).toLocaleString()));
  }
  if (r.stringcup) uses.push(S.settings.relayStringcup(r.stringcup));
  if (r.groups) uses.push(S.settings.relayGroups(r.groups));
  const health = r.health;
  return h(
    'tr',
    null,
    h('td', null, h('code', null, r.url)),
    h('td', null, uses.join(' · ')),
    h(
      'td',
      null,
      health ? badge(health.state, `health health-${health.state}`) : h('span', { class: 'muted' }, S.settings.relayPolled),
      health?.last_error ? h('div', { class: 'muted hint' }, health.last_error) : null,
    ),
  );
}

function relayMoveBox(current: string) {
  const url = h('input', { type: 'url', id: 'set-move-url', placeholder: 'https://relay.example', required: true });
  const cert = h('input', {
    type: 'text',
    id: 'set-move-cert',
    autocomplete: 'off',
    spellcheck: false,
    pattern: '[0-9a-fA-F:]{64,95}',
  });
  const out = h('p', { id: 'set-move-out', role: 'status', 'aria-live': 'polite' });
  const confirmBox = h('div', { id: 'set-move-confirm', role: 'group', 'aria-labelledby': 'set-move-confirm-title' });
  const button = h('button', { type: 'submit' }, S.settings.moveButton) as HTMLButtonElement;
  const answer = (cls: string, text: string) => {
    moveForm.out = { cls, text };
    moveForm.paint();
  };
  const fail = (x: unknown) =>
    answer('error', x instanceof BackendError && x.code === 'relay' ? S.settings.moveDown(x.message) : errorText(x));
  const move = async (to: string, pin: string | undefined) => {
    moveForm.confirm = null;
    moveForm.busy = true;
    answer('muted', S.settings.moveChecking);
    try {
      await backend.relayMove(to, pin);
      for (const id of ['set-move-url', 'set-move-cert']) {
        const el = document.getElementById(id);
        if (el instanceof HTMLInputElement) el.value = '';
      }
      moveForm.busy = false;
      answer('', '');
      say(S.settings.moved(to.replace(/\/+$/, '')));
      await render(true);
    } catch (x) {
      moveForm.busy = false;
      fail(x);
    }
  };
  const paint = () => {
    button.disabled = moveForm.busy;
    out.className = moveForm.out.cls;
    out.textContent = moveForm.out.text;
    const c = moveForm.confirm;
    confirmBox.hidden = c === null;
    if (c === null) {
      confirmBox.replaceChildren();
      return;
    }
    const yes = h('button', { type: 'button', id: 'set-move-yes', onclick: () => move(c.to, c.pin) }, S.settings.moveConfirmButton);
    const no = h(
      'button',
      {
        type: 'button',
        class: 'secondary',
        onclick: () => {
          moveForm.confirm = null;
          moveForm.paint();
          document.querySelector<HTMLButtonElement>('#relay-move button[type=submit]')?.focus();
        },
      },
      S.settings.moveCancel,
    );
    confirmBox.replaceChildren(
      h('p', { id: 'set-move-confirm-title' }, h('strong', null, S.settings.moveConfirmTitle(c.to.replace(/\/+$/, '')))),
      h('p', { id: 'set-move-confirm-text' }, S.settings.moveConfirm(c.plan)),
      yes,
      ' ',
      no,
    );
  };
  moveForm.paint = paint;
  paint();
  return h(
    'form',
    {
      'aria-labelledby': 'move-title',
      id: 'relay-move',
      onsubmit: async (e: Event) => {
        e.preventDefault();
        const to = url.value.trim();
        const pin = cert.value.trim() || undefined;
        moveForm.confirm = null;
        answer('muted', '');
        try {
          const plan = await backend.relayMovePlan();
          // Say what will happen, and move only on the person's word.
          moveForm.confirm = { to, pin, plan };
          moveForm.paint();
          document.getElementById('set-move-yes')?.focus();
        } catch (x) {
          fail(x);
        }
      },
    },
    h('h3', { id: 'move-title' }, S.settings.moveTitle),
    h('p', { class: 'muted hint' }, S.settings.moveNote(current)),
    field(S.settings.moveUrl, url),
    field(S.settings.moveCert, cert),
    button,
    confirmBox,
    out,
  );
}

function hostedRelayBox(r: HostedRelay) {
  const row = (label: string, value: Node | string) => h('tr', null, h('th', { scope: 'row' }, label), h('td', null, value));
  const peers = `switchboard init --name NAME --relay ${r.url} --relay-cert-sha256 ${r.cert_sha256}`;
  return h(
    'section',
    { 'aria-labelledby': 'hosted-title', id: 'hosted-relay' },
    h('h3', { id: 'hosted-title' }, S.settings.hosted),
    h(
      'table',
      null,
      h(
        'tbody',
        null,
        row(S.settings.hostedUrl, h('code', null, r.url)),
        row(S.settings.hostedCert, h('code', { class: 'safety' }, r.cert_sha256)),
        row(S.settings.hostedPort, String(r.port)),
        row(S.settings.hostedData, h('code', null, r.data_dir)),
        row(
          S.settings.hostedState,
          badge(
            r.accepting ? S.settings.hostedAccepting : S.settings.hostedDown,
            `health health-${r.accepting ? 'connected' : 'disconnected'}`,
          ),
        ),
        r.error ? row(S.settings.lastError, r.error) : null,
      ),
    ),
    h('p', null, S.settings.hostedPeers),
    h('pre', null, h('code', null, peers)),
    copyButton(peers),
  );
}

async function meView() {
  const who = await backend.whoami();
  me = who;
  return h(
    'div',
    null,
    h('h2', null, S.me.title),
    h('p', null, S.me.intro),
    identities(who).map(([p, id]) => identityCard(p, id)),
  );
}

// ----- start --------------------------------------------------------------------------------

let unsubscribe: (() => void) | null = null;

let shellHooked = false;
function hookShell() {
  if (shellHooked) return;
  shellHooked = true;
  backend.onLink((text) => {
    if (me) openPreview(text);
  });
  // A clicked notification opens its conversation.
  backend.onOpenConversation((conversation) => {
    if (me && conversation.startsWith('c:')) go(`#/c/${encodeURIComponent(conversation.slice(2))}`);
    else if (me && conversation.startsWith('g:')) go(`#/g/${encodeURIComponent(conversation.slice(2))}`);
  });
}

/** After the first real screen (first run or the app) is on screen, once. */
let paintReported = false;
function reportPaint() {
  if (paintReported) return;
  paintReported = true;
  requestAnimationFrame(() => requestAnimationFrame(() => backend.painted()));
}

async function start() {
  hookShell();
  try {
    if (!(await backend.initialized())) {
      firstRun();
      reportPaint();
      return;
    }
    me = await backend.whoami();
    if (backend.justInitialized()) {
      firstRunDone(me);
      return;
    }
  } catch (e) {
    mount(root, h('main', { id: 'main' }, h('p', { class: 'error', role: 'alert' }, errorText(e))));
    return;
  }
  window.onhashchange = () => {
    if (location.hash !== noticeHash) clearNotice();
    void render();
    main.focus();
  };
  await render();
  reportPaint();
  unsubscribe?.();
  unsubscribe = backend.onEvent(() => {
    if (!document.querySelector('dialog[open]')) void render(true);
  });
  document.body.dataset.ready = 'true';
}

mount(root, h('p', null, S.loading));
void start();
