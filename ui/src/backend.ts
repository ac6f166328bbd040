// The only place that talks to the runtime. One `Backend` interface, two implementations: Tauri
// IPC (the desktop app embeds or attaches to the runtime) and HTTP to the runtime's localhost
// bridge (the same UI in a browser, as the end-to-end tests run it).

import { invoke } from '@tauri-apps/api/core';
import { listen } from '@tauri-apps/api/event';

/** An error as it crosses from the runtime: a stable code and a human message. */
export class BackendError extends Error {
  constructor(
    public code: string,
    message: string,
    /** What the runtime's error carries for a client to act on (`untrusted_relay`: url, cert_sha256). */
    public data: Record<string, unknown> | null = null,
  ) {
    super(message);
  }
}

/** One protocol section of `whoami` (letagents, stringcup, ... whatever the runtime reports). */
export interface Identity {
  address?: string;
  id?: string;
  mailbox_id?: string;
  safety_number?: string;
  fingerprint?: string;
  fingerprint_short?: string;
  relay?: string;
}

/** What a relay move would do now (`relay_move_plan`). */
export interface MovePlan {
  from: string;
  letagents: number;
  agent_mail: number;
  /** The people those letagents and Agent Mail contacts are (a person's channels count once). */
  told: number;
  stringcup: number;
  groups: number;
  drain_hours: number;
  summary: string;
}

export interface Whoami {
  name: string;
  profile: string;
  keystore: string;
  [protocol: string]: Identity | string | null | undefined;
}

export interface Contact {
  name: string;
  protocol: string;
  id: string;
  address: string;
  safety_number: string | null;
  verified: boolean;
  state: string;
  allow: string[];
  key_changed: boolean;
  new_safety_number: string | null;
  relay: string | null;
  request: string;
  /** The owner blocked this contact: what it sends is dropped, nothing is sent to it. */
  blocked?: boolean;
  /** Messages dropped while blocked. */
  blocked_dropped?: number;
  /** What the protocol proves about who sent a message. */
  sender_auth?: 'signed_end_to_end' | 'asserted_by_relay';
  /** On the same network with a bound LAN connection now (issue 17). */
  nearby?: boolean;
  /** One person over several channels (a contact link, or a merge). */
  person?: boolean;
  /** A person's channels, in the order messages try them. */
  channels?: Contact[];
  /** A person's channel: usable, and the last message sent on it got through. */
  reachable?: boolean;
}

export interface Message {
  id: string;
  protocol: string;
  direction: 'in' | 'out';
  from: string;
  to: string;
  kind: string;
  body: unknown;
  reply_to: string | null;
  from_agent: string | null;
  to_agent: string | null;
  ts: number;
  state: string;
  detail: string;
  /** Incoming only: what the protocol proves about the sender. */
  sender_auth?: 'signed_end_to_end' | 'asserted_by_relay' | null;
  /** The path that carried it: direct (LAN), relay, or '' (not handed over yet). */
  path?: string;
  /** A person's message another channel carried: the id it was first queued under. */
  fallback_of?: string;
  /** The channel (protocol) that message was first queued on. */
  moved_from?: string;
  /** Agent Mail: the files it carries (never their bytes; fetched only to save). */
  attachments?: Attachment[];
  /** Incoming, addressed to a local agent: how far it was handed out to that agent. */
  handout?: Handout;
}

/** How far a message addressed to one of the owner's agents got to it. */
export interface Handout {
  agent: string;
  /** queued (waiting), paused (loop guard), handed (given out), delivered (acknowledged), skipped. */
  state: 'queued' | 'paused' | 'handed' | 'delivered' | 'skipped';
  delivered_at: number;
}

/** The outbound mode of agent messages to one contact: its own, or the profile's (default). */
export type OutboundMode = 'default' | 'auto' | 'review';

/** A file of an Agent Mail message, as listed with it. */
export interface Attachment {
  part: number;
  /** The sender's name made inert (no path); null when it gave none. */
  name: string | null;
  media_type: string;
  size: number;
}

/** A file to send as an Agent Mail part. */
export interface FileToSend {
  name: string;
  /** Null: the runtime types it by extension. */
  media_type: string | null;
  /** The bytes, base64. */
  data: string;
}

/** A relay the profile reads: its own first (with the live connection's health), then each
 * other one it still reads, and why. */
export interface RelayStatus {
  url: string;
  own: boolean;
  /** Own relay only: the connection that is live. */
  protocol?: string;
  health?: { state: string; last_error: string; since: number };
  /** Own relay only: the people whose letagents and Agent Mail messages arrive there. */
  people?: number;
  /** Other relays: moved away from and read until then (ms). */
  drain_until?: number | null;
  stringcup: number;
  groups: number;
}

export interface Agent {
  name: string;
  harness: string;
  status: string;
  where: string;
  updated_at: number;
}

export interface Status {
  pid: number;
  profile: string;
  bridge: string | null;
  keystore: string;
  relays: RelayStatus[];
  outbox: number;
  agents: Agent[];
  lan?: LanStatus;
}

/** The LAN layer (`switchboard lan status`). */
export interface LanStatus {
  enabled: boolean;
  running: boolean;
  peer_id: string | null;
  nearby: string[];
}

export interface AuditRow {
  id: number;
  at: number;
  direction: string;
  protocol: string;
  peer: string;
  message_id: string;
  kind: string;
  state: string;
  detail: string;
  /** The path that carried the message (direct, relay), or ''. */
  path?: string;
}

/** An outbound agent message held for the operator's approval. */
export interface ReviewItem {
  id: number;
  /** The local agent that wrote it. */
  agent: string;
  /** The contact it is for (a 1:1 message), or null for a group's. */
  contact: string | null;
  /** The letmeknow group it is for, if any, and the member it addresses. */
  group?: string | null;
  to?: string | null;
  kind: string;
  text: string;
  reply_to: string | null;
  to_agent: string | null;
  /** Unix time in milliseconds. */
  created_at: number;
  /** An ASNET challenge: approving sends VERIFY for exactly `action`. */
  asnet?: { challenge_id: string; action: Record<string, unknown>; expires_at: number | null } | null;
}

/** `asnet_status`: the ASNET/1 account and what the service last told it. */
export interface AsnetStatus {
  service: string;
  mailbox: string;
  member_id: string | null;
  discovery: boolean;
  /** Unix ms of the last mailbox read; 0 before the first. */
  last_sync_at: number;
  /** The last read's failure; empty when it worked. */
  last_error: string;
  sync_error?: string;
  requests: { id: number; action: Record<string, unknown>; requested_by: string; state: string; created_at: number }[];
  challenges: { challenge_id: string; action: Record<string, unknown>; state: string; expires_at: number }[];
  invitations: { request_id: string; from_member_id: string; scopes: string[]; expires_at: number; state: string }[];
  connections: { member_id: string; scopes: string[]; updated_at: number }[];
  lookups: unknown[];
  warnings: { id: number; kind: string; detail: string; created_at: number }[];
}

/** The delivery policy (`switchboard policy`). */
export interface Policy {
  /** Outbound agent messages: sent at once (auto) or held for review. */
  review: 'auto' | 'review';
  loop_limit: number;
  digest_secs: number;
}

export interface GroupSummary {
  group: string;
  /** The person's local name for it ('' when never named). */
  name?: string;
  /** The other members' names as this session noted them (for an unnamed group). */
  member_names?: string[];
  /** The session in the group is the owner's default one (not an agent's). */
  own?: boolean;
  handle: string;
  /** When this profile made or joined it (Unix ms). */
  joined_at?: number;
  relay: string;
  state: string;
  unread: number;
  /** Outbound mode of the agent's sends: auto, review or default (the profile's policy). */
  mode?: string;
  /** The group's loop guard: hops since your last input, the limit, whether it paused. */
  loop_guard?: { hops: number; limit: number; paused: boolean; held: number };
}

/** One row of a group's local log. */
export interface GroupMessage {
  row: number;
  id: string;
  /** message, leave, event (membership) or alert (an integrity problem). */
  kind: string;
  /** done, sending or commit_pending. */
  state: string;
  outgoing: boolean;
  from: { name: string; fingerprint: string };
  to: string;
  reply_to: string;
  content: string;
  read: boolean;
  /** Unix time in milliseconds. */
  at: number;
}

export interface GroupHistory {
  group: string;
  name: string;
  handle: string;
  messages: GroupMessage[];
}

/** An invite this runtime opened and what became of it. */
export interface InviteStatus {
  invite: string;
  group: string;
  link: string;
  expires_at: number;
  state: 'waiting' | 'used' | 'expired' | 'failed';
  /** Who joined through it (used). */
  joined: string;
  error: string;
}

export interface GroupMember {
  name: string;
  fingerprint: string;
  invited_by: string;
  you: boolean;
}

export interface GroupMembers {
  group: string;
  epoch: number;
  members: GroupMember[];
}

export interface GroupInvite {
  group: string;
  link: string;
  /** Unix time in milliseconds. */
  expires_at: number;
  invite: string;
}

/** The relay the desktop app hosts on this machine (settings shows it; peers pin its certificate). */
export interface HostedRelay {
  url: string;
  cert_sha256: string;
  port: number;
  data_dir: string;
  running: boolean;
  accepting: boolean;
  error: string | null;
}

export interface InitOptions {
  name: string;
  /** A relay URL, or null to host one on this machine. */
  relay: string | null;
}

export interface SendOptions {
  kind?: string;
  reply_to?: string;
}

/** What the runtime tells the UI without being asked. */
export type UiEvent =
  | { type: 'message'; id: string }
  | { type: 'request'; name: string }
  | { type: 'delivery'; id: string; state: string }
  | { type: 'key_changed'; name: string }
  | { type: 'group_message'; handle: string; group: string; id: string; from: string; own: boolean }
  | { type: 'changed' };

export interface Backend {
  readonly kind: 'tauri' | 'http';
  /** Whether the profile has an identity yet (false: show first run). */
  initialized(): Promise<boolean>;
  /** Whether this page load follows the first-run screen (true once: show the new addresses). */
  justInitialized(): boolean;
  init(opts: InitOptions): Promise<Whoami>;
  whoami(): Promise<Whoami>;
  status(): Promise<Status>;
  contacts(): Promise<Contact[]>;
  requests(): Promise<Contact[]>;
  contactAdd(address: string, name?: string): Promise<Contact>;
  /** Accepts a request, under `newName` if given. */
  contactAccept(name: string, newName?: string): Promise<Contact>;
  /** Makes `other`'s channels part of `name` after the owner compared `other`'s safety number. */
  contactMerge(name: string, other: string, safetyNumber: string): Promise<Contact>;
  /** Takes one channel (by protocol) out of a person. */
  contactSplit(name: string, protocol: string): Promise<unknown>;
  contactDeny(name: string): Promise<void>;
  /** Blocks (or unblocks) a contact; Agent Mail contacts at the relay too. */
  contactBlock(name: string, blocked: boolean): Promise<Contact>;
  contactVerify(name: string): Promise<Contact>;
  contactAllow(name: string, kinds: string[]): Promise<Contact>;
  pair(token: string, name?: string): Promise<Contact>;
  send(contact: string, text: string, opts?: SendOptions): Promise<Message>;
  /** Agent Mail: text with files carried as parts after it. */
  mailSend(contact: string, text: string, files: FileToSend[], opts?: SendOptions): Promise<Message>;
  /** Offers attachment `part` of message `id` as a download; it is never opened or rendered. */
  saveAttachment(id: string, part: number, name: string): Promise<void>;
  /** A conversation, oldest first: the newest `limit` messages (the runtime's default 500). */
  conversation(contact: string, limit?: number): Promise<Message[]>;
  log(search?: string, limit?: number): Promise<AuditRow[]>;
  agents(): Promise<Agent[]>;
  reviewList(): Promise<ReviewItem[]>;
  groups(): Promise<GroupSummary[]>;
  groupSession(name: string): Promise<unknown>;
  groupMembers(group: string): Promise<GroupMembers>;
  groupInvite(group?: string): Promise<GroupInvite>;
  /** Joins with an invite link (waits until the inviter lets this profile in). */
  groupJoin(link: string): Promise<{ group: string; name: string }>;
  /** Trusts the relay at `url` with the certificate whose SHA-256 is `certSha256` (hex). */
  relayTrust(url: string, certSha256: string): Promise<void>;
  /** Moves the profile to the relay at `url` (pinning `certSha256` for a self-signed one). */
  relayMovePlan(): Promise<MovePlan>;
  relayMove(url: string, certSha256?: string): Promise<Whoami>;
  /** A new group with a local name, made by the owner's default session. */
  groupCreate(name: string): Promise<{ group: string; name: string }>;
  groupRename(group: string, name: string): Promise<void>;
  /** A group's newest messages, oldest first; `markRead` when the person sees them. */
  groupHistory(group: string, limit?: number, markRead?: boolean): Promise<GroupHistory>;
  /** Sends to a group; `to` (a member's fingerprint) addresses one member (an @mention). */
  groupSend(group: string, text: string, to?: string): Promise<unknown>;
  /** The invites this runtime opened and what became of them. */
  groupInvites(): Promise<InviteStatus[]>;
  /** Approves (as written, or with the operator's `text` instead) or rejects a held message. */
  reviewDecide(id: number, approve: boolean, text?: string): Promise<void>;
  /** A contact's outbound mode for agent messages; with `mode`, sets it first. */
  contactReview(name: string, mode?: OutboundMode): Promise<OutboundMode>;
  /** The delivery policy; with `review`, switches review mode first. */
  policy(review?: 'auto' | 'review'): Promise<Policy>;
  /** The LAN layer; with `on`, switches it first. */
  lan(on?: boolean): Promise<LanStatus>;
  /** One ASNET/1 request (`op` is one of the `asnet_*` operations). */
  asnet<T>(req: Json): Promise<T>;
  /** Sets a group's outbound mode for agent sends (auto, review, default). */
  groupMode(group: string, mode: string): Promise<void>;
  /** Resumes a group the loop guard paused (operator input). */
  groupResume(group: string): Promise<void>;
  /** Subscribes to runtime events; returns an unsubscribe function. */
  onEvent(cb: (e: UiEvent) => void): () => void;
  /** Links (`switchboard:...`) the desktop shell was asked to open. */
  onLink(cb: (text: string) => void): void;
  /** Tells the shell the first screen is painted. */
  painted(): void;
  /** Tells the shell the unread total (the tray shows it); nothing in a browser. */
  unreadTotal(n: number): void;
  /** Desktop-only settings (tray, notifications); null in a browser. */
  settings(): Promise<Record<string, boolean> | null>;
  setSetting(key: string, value: boolean): Promise<void>;
  /** Whether first run may host a relay on this machine (the desktop app embeds relay-lite). */
  readonly canHostRelay: boolean;
  /** The relay the app hosts; null when it hosts none (or in a browser). */
  hostedRelay(): Promise<HostedRelay | null>;
  /** Conversations whose notifications are muted (`c:NAME`); null where there are no notifications. */
  muted(): Promise<string[] | null>;
  setMuted(conversation: string, muted: boolean): Promise<void>;
  /** A clicked notification asks to open a conversation (`c:NAME`). */
  onOpenConversation(cb: (conversation: string) => void): void;
}

export type Json = Record<string, unknown>;

/** The runtime's request vocabulary (core/src/bridge/api.rs), shared by both transports. */
abstract class RequestBackend implements Backend {
  abstract readonly kind: 'tauri' | 'http';
  protected abstract rpc<T>(req: Json): Promise<T>;
  abstract initialized(): Promise<boolean>;
  justInitialized() {
    return false;
  }
  abstract init(opts: InitOptions): Promise<Whoami>;
  abstract onEvent(cb: (e: UiEvent) => void): () => void;
  onLink(_cb: (text: string) => void) {}
  painted() {}
  unreadTotal(_n: number) {}
  abstract settings(): Promise<Record<string, boolean> | null>;
  abstract setSetting(key: string, value: boolean): Promise<void>;
  readonly canHostRelay: boolean = false;
  async hostedRelay(): Promise<HostedRelay | null> {
    return null;
  }
  async muted(): Promise<string[] | null> {
    return null;
  }
  async setMuted(_conversation: string, _muted: boolean): Promise<void> {
    throw new BackendError('unsupported', 'notifications belong to the desktop app');
  }
  onOpenConversation(_cb: (conversation: string) => void) {}

  whoami() {
    return this.rpc<Whoami>({ op: 'whoami' });
  }
  status() {
    return this.rpc<Status>({ op: 'status' });
  }
  contacts() {
    return this.rpc<Contact[]>({ op: 'contact_list' });
  }
  requests() {
    return this.rpc<Contact[]>({ op: 'contact_requests' });
  }
  contactAdd(address: string, name?: string) {
    return this.rpc<Contact>({ op: 'contact_add', address, name: name || null });
  }
  contactAccept(name: string, newName?: string) {
    return this.rpc<Contact>({ op: 'contact_accept', name, new_name: newName || null });
  }
  contactMerge(name: string, other: string, safetyNumber: string) {
    return this.rpc<Contact>({ op: 'contact_merge', name, other, confirm_safety_number: safetyNumber });
  }
  contactSplit(name: string, protocol: string) {
    return this.rpc<unknown>({ op: 'contact_split', name, protocol });
  }
  async contactDeny(name: string) {
    await this.rpc({ op: 'contact_deny', name });
  }
  contactBlock(name: string, blocked: boolean) {
    return this.rpc<Contact>({ op: blocked ? 'contact_block' : 'contact_unblock', name });
  }
  contactVerify(name: string) {
    return this.rpc<Contact>({ op: 'contact_verify', name });
  }
  contactAllow(name: string, kinds: string[]) {
    return this.rpc<Contact>({ op: 'contact_allow', name, kinds });
  }
  pair(token: string, name?: string) {
    return this.rpc<Contact>({ op: 'pair_wait', token, name: name || null, timeout_secs: 120 });
  }
  send(contact: string, text: string, opts: SendOptions = {}) {
    return this.rpc<Message>({ op: 'send', contact, text, kind: opts.kind ?? null, reply_to: opts.reply_to ?? null });
  }
  mailSend(contact: string, text: string, files: FileToSend[], opts: SendOptions = {}) {
    return this.rpc<Message>({ op: 'mail_send', contact, text, subject: null, reply_to: opts.reply_to ?? null, attachments: files });
  }
  async saveAttachment(id: string, part: number, name: string) {
    const v = await this.rpc<{ name: string | null; data_base64url: string }>({ op: 'mail_attachment', id, part });
    const b64 = v.data_base64url.replace(/-/g, '+').replace(/_/g, '/');
    const raw = atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4));
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    const url = URL.createObjectURL(new Blob([bytes], { type: 'application/octet-stream' }));
    try {
      clickDownload(url, v.name ?? name);
    } finally {
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    }
  }
  conversation(contact: string, limit?: number) {
    return this.rpc<Message[]>({ op: 'conversation', contact, limit: limit ?? null });
  }
  log(search?: string, limit = 500) {
    return this.rpc<AuditRow[]>({ op: 'log', search: search || null, limit });
  }
  agents() {
    return this.rpc<Agent[]>({ op: 'agent_list' });
  }
  reviewList() {
    return this.rpc<ReviewItem[]>({ op: 'review_list' });
  }
  groups() {
    return this.rpc<GroupSummary[]>({ op: 'group_list' });
  }
  groupSession(name: string) {
    return this.rpc({ op: 'group_session', name });
  }
  groupMembers(group: string) {
    return this.rpc<GroupMembers>({ op: 'group_members', group });
  }
  groupInvite(group?: string) {
    return this.rpc<GroupInvite>({ op: 'group_invite', group: group ?? null });
  }
  groupJoin(link: string) {
    return this.rpc<{ group: string; name: string }>({ op: 'group_join', link });
  }
  async relayTrust(url: string, certSha256: string) {
    await this.rpc({ op: 'relay_trust', url, cert_sha256: certSha256 });
  }
  relayMovePlan() {
    return this.rpc<MovePlan>({ op: 'relay_move_plan' });
  }
  relayMove(url: string, certSha256?: string) {
    return this.rpc<Whoami>({ op: 'relay_move', url, cert_sha256: certSha256 ?? null });
  }
  groupCreate(name: string) {
    return this.rpc<{ group: string; name: string }>({ op: 'group_create', name });
  }
  async groupRename(group: string, name: string) {
    await this.rpc({ op: 'group_rename', group, name });
  }
  groupHistory(group: string, limit?: number, markRead = false) {
    return this.rpc<GroupHistory>({ op: 'group_history', group, limit: limit ?? null, mark_read: markRead });
  }
  groupSend(group: string, text: string, to?: string) {
    return this.rpc({ op: 'group_send', group, text, to: to ?? null });
  }
  groupInvites() {
    return this.rpc<InviteStatus[]>({ op: 'group_invites' });
  }
  async reviewDecide(id: number, approve: boolean, text?: string) {
    await this.rpc(approve ? { op: 'review_approve', id, text: text ?? null } : { op: 'review_reject', id });
  }
  async contactReview(name: string, mode?: OutboundMode) {
    const r = await this.rpc<{ outbound: OutboundMode }>({ op: 'contact_review', name, mode: mode ?? null });
    return r.outbound;
  }
  policy(review?: 'auto' | 'review') {
    return this.rpc<Policy>({ op: 'policy', review: review ?? null });
  }
  lan(on?: boolean) {
    return this.rpc<LanStatus>({ op: 'lan', on: on ?? null });
  }
  asnet<T>(req: Json) {
    if (typeof req.op !== 'string' || !req.op.startsWith('asnet_')) {
      return Promise.reject(new BackendError('invalid_input', 'not an ASNET request'));
    }
    return this.rpc<T>(req);
  }
  async groupMode(group: string, mode: string) {
    await this.rpc({ op: 'group_mode', group, mode });
  }
  async groupResume(group: string) {
    await this.rpc({ op: 'group_resume', group });
  }
}

function toBackendError(e: unknown): BackendError {
  if (e instanceof BackendError) return e;
  if (e && typeof e === 'object' && 'code' in e && 'message' in e) {
    const o = e as { code: unknown; message: unknown; data?: unknown };
    const data = o.data && typeof o.data === 'object' ? (o.data as Record<string, unknown>) : null;
    return new BackendError(String(o.code), String(o.message), data);
  }
  return new BackendError('internal', String(e));
}

/** HTTP to the runtime's bridge, same origin, authenticated by an HttpOnly session cookie. */
/** Starts a download of `href` as `name` (the browser asks where; nothing is opened). */
function clickDownload(href: string, name: string) {
  const a = document.createElement('a');
  a.href = href;
  a.download = name;
  a.rel = 'noopener';
  a.hidden = true;
  document.body.append(a);
  a.click();
  a.remove();
}

export class HttpBackend extends RequestBackend {
  readonly kind = 'http' as const;
  private ready: Promise<void>;
  private welcome = false;

  /** The bridge serves the bytes itself: `application/octet-stream`, `Content-Disposition: attachment`. */
  override async saveAttachment(id: string, part: number, name: string) {
    await this.ready;
    clickDownload(`${this.base}/v1/attachment?id=${encodeURIComponent(id)}&part=${part}`, name);
  }

  constructor(private base = '') {
    super();
    this.ready = this.exchangeCode();
  }

  /** Trades the single-use code in the URL fragment for a session cookie, then forgets it. */
  private async exchangeCode() {
    const m = /(?:^#|&)code=([A-Za-z0-9_-]+)/.exec(location.hash);
    if (!m) return;
    this.welcome = /(?:^#|&)welcome=1/.test(location.hash);
    history.replaceState(null, '', location.pathname + location.search);
    await this.post('/v1/session', { code: m[1] });
  }

  private async post<T>(path: string, body: Json): Promise<T> {
    let r: Response;
    try {
      r = await fetch(this.base + path, {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
    } catch (e) {
      throw new BackendError('unreachable', `the runtime did not answer: ${e}`);
    }
    const text = await r.text();
    let data: unknown = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      throw new BackendError('internal', `bad answer from the runtime (${r.status})`);
    }
    if (!r.ok) throw toBackendError(data ?? { code: 'http', message: `HTTP ${r.status}` });
    return data as T;
  }

  protected async rpc<T>(req: Json): Promise<T> {
    await this.ready;
    return this.post<T>('/v1/rpc', req);
  }

  async initialized() {
    await this.ready;
    try {
      await this.rpc({ op: 'whoami' });
      return true;
    } catch (e) {
      if (e instanceof BackendError && e.code === 'not_initialized') return false;
      throw e;
    }
  }

  justInitialized() {
    const w = this.welcome;
    this.welcome = false;
    return w;
  }

  async init(opts: InitOptions) {
    await this.ready;
    // The first-run host creates the identity, starts the runtime's bridge and answers with a
    // single-use sign-in link to it: the page moves there.
    const r = await this.post<{ url: string; whoami: Whoami }>('/v1/setup', { name: opts.name, relay: opts.relay });
    location.assign(r.url);
    return r.whoami;
  }

  onEvent(cb: (e: UiEvent) => void) {
    // Server-sent events from the bridge (cookie-authenticated, same origin); EventSource
    // reconnects by itself. A periodic `changed` covers anything the stream does not carry.
    let es: EventSource | null = null;
    void this.ready.then(() => {
      es = new EventSource(this.base + '/v1/events', { withCredentials: true });
      es.onmessage = (m) => {
        try {
          cb(JSON.parse(m.data) as UiEvent);
        } catch {
          /* ignore a malformed event */
        }
      };
    });
    const tick = setInterval(() => cb({ type: 'changed' }), 5000);
    return () => {
      es?.close();
      clearInterval(tick);
    };
  }

  async settings() {
    return null;
  }
  async setSetting() {
    throw new BackendError('unsupported', 'settings are kept by the desktop app');
  }
}

/** Tauri IPC: one command per request area, errors as {code, message}. */
export class TauriBackend extends RequestBackend {
  readonly kind = 'tauri' as const;
  readonly canHostRelay = true;

  protected async rpc<T>(req: Json): Promise<T> {
    try {
      return await invoke<T>('runtime_request', { request: req });
    } catch (e) {
      throw toBackendError(e);
    }
  }
  async initialized() {
    try {
      return await invoke<boolean>('profile_initialized');
    } catch (e) {
      throw toBackendError(e);
    }
  }
  async init(opts: InitOptions) {
    try {
      return await invoke<Whoami>('profile_init', { name: opts.name, relay: opts.relay });
    } catch (e) {
      throw toBackendError(e);
    }
  }
  onEvent(cb: (e: UiEvent) => void) {
    let un: (() => void) | null = null;
    void listen<UiEvent>('runtime-event', (e) => cb(e.payload)).then((f) => (un = f));
    const tick = setInterval(() => cb({ type: 'changed' }), 5000);
    return () => {
      un?.();
      clearInterval(tick);
    };
  }
  onLink(cb: (text: string) => void) {
    void listen<string>('open-link', (e) => cb(e.payload));
  }
  painted() {
    void invoke('app_painted').catch(() => {});
  }
  /** Only a change is sent. */
  private lastUnread = -1;
  unreadTotal(n: number) {
    if (n === this.lastUnread) return;
    this.lastUnread = n;
    void invoke('app_unread', { count: n }).catch(() => {});
  }
  async settings() {
    try {
      return await invoke<Record<string, boolean>>('settings_get');
    } catch (e) {
      throw toBackendError(e);
    }
  }
  async setSetting(key: string, value: boolean) {
    try {
      await invoke('settings_set', { key, value });
    } catch (e) {
      throw toBackendError(e);
    }
  }
  async hostedRelay() {
    try {
      return await invoke<HostedRelay | null>('relay_hosted');
    } catch (e) {
      throw toBackendError(e);
    }
  }
  async muted() {
    try {
      return await invoke<string[]>('mute_get');
    } catch (e) {
      throw toBackendError(e);
    }
  }
  async setMuted(conversation: string, muted: boolean) {
    try {
      await invoke('mute_set', { conversation, muted });
    } catch (e) {
      throw toBackendError(e);
    }
  }
  onOpenConversation(cb: (conversation: string) => void) {
    void listen<string>('open-conversation', (e) => cb(e.payload));
  }
}

/** The backend for where this UI runs. */
export function pickBackend(): Backend {
  const w = window as unknown as { __TAURI_INTERNALS__?: unknown };
  return w.__TAURI_INTERNALS__ ? new TauriBackend() : new HttpBackend();
}
