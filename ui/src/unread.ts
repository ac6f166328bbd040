// What the person has read, kept on this device: the runtime has no read marker for the owner's
// own conversations (its unread counts are per agent), so the UI remembers, per profile and
// contact, the id of the newest incoming message it showed. A conversation's unread count is the
// number of incoming messages after that id, in the runtime's arrival order.

import type { Message } from './backend';

type Markers = Record<string, string>;

function key(profile: string) {
  return `switchboard.read.v1:${profile}`;
}

function load(profile: string): Markers | null {
  try {
    const raw = localStorage.getItem(key(profile));
    if (raw === null) return null;
    const v: unknown = JSON.parse(raw);
    if (!v || typeof v !== 'object' || Array.isArray(v)) return {};
    const out: Markers = {};
    for (const [k, id] of Object.entries(v as Record<string, unknown>)) if (typeof id === 'string') out[k] = id;
    return out;
  } catch {
    return {};
  }
}

function save(profile: string, m: Markers) {
  try {
    localStorage.setItem(key(profile), JSON.stringify(m));
  } catch {
    /* storage full or disabled: unread counts then last for the session only */
  }
}

/** Read markers of one profile. */
export class ReadMarkers {
  private markers: Markers;
  /** True when this device had never stored markers for the profile (first start). */
  readonly fresh: boolean;

  constructor(private profile: string) {
    const m = load(profile);
    this.fresh = m === null;
    this.markers = m ?? {};
    if (this.fresh) save(profile, this.markers);
  }

  /** Incoming messages of `msgs` (oldest first) after the marker of `contact`. */
  unread(contact: string, msgs: Message[]): number {
    const marker = this.markers[contact];
    let start = 0;
    if (marker !== undefined) {
      const i = msgs.findIndex((m) => m.id === marker);
      // A marker older than the loaded window: everything loaded is newer.
      if (i >= 0) start = i + 1;
    }
    let n = 0;
    for (let i = start; i < msgs.length; i++) if (msgs[i]?.direction === 'in') n++;
    return n;
  }

  /** Marks everything in `msgs` (oldest first) read; returns whether anything changed. */
  markRead(contact: string, msgs: Message[]): boolean {
    const lastIn = [...msgs].reverse().find((m) => m.direction === 'in');
    if (!lastIn || this.markers[contact] === lastIn.id) return false;
    this.markers[contact] = lastIn.id;
    save(this.profile, this.markers);
    return true;
  }
}
