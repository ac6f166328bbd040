// Recognises what a person pastes (or opens as a `switchboard:` link): an address, ID, rendezvous
// token or invite link of any protocol the app knows, as data the preview renders generically.

export interface Recognised {
  /** Protocol id as the runtime names it (letagents, agent_mail, stringcup, letmeknow), or
   *  `switchboard` for a contact link naming several. */
  protocol: string;
  /** Human label of what it is. */
  what: string;
  /** The exact text to hand to the runtime. */
  value: string;
  /** What to do with it: add a contact, pair by rendezvous, or join a group. */
  action: 'add' | 'pair' | 'join';
  /** Fields to show in the preview, in order. */
  fields: [string, string][];
  /** A name suggestion for the contact, if the text carries one. */
  suggestedName?: string;
  /** The fingerprint to show, computed locally (may resolve later). */
  fingerprint?: Promise<string | null>;
  /** A group invite: who invites, and their name for the group, as the link states them. */
  inviter?: string;
  groupName?: string;
}

/** A `key=value` parameter of an invite link's fragment (after the secret), decoded and tidied. */
function fragmentParam(hash: string, key: string): string | undefined {
  for (const part of hash.replace(/^#/, '').split('&').slice(1)) {
    const [k, v] = part.split('=', 2);
    if (k !== key || v === undefined) continue;
    try {
      const text = decodeURIComponent(v.replace(/\+/g, ' ')).replace(/[\u0000-\u001f\u007f]/g, '').trim();
      return text ? text.slice(0, 64) : undefined;
    } catch {
      return undefined;
    }
  }
  return undefined;
}

const B64U = /^[A-Za-z0-9_-]+$/;

function b64uDecode(s: string): Uint8Array | null {
  if (!B64U.test(s)) return null;
  const pad = s.replace(/-/g, '+').replace(/_/g, '/') + '==='.slice((s.length + 3) % 4);
  try {
    const bin = atob(pad);
    return Uint8Array.from(bin, (c) => c.charCodeAt(0));
  } catch {
    return null;
  }
}

const B32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
function base32(bytes: Uint8Array): string {
  let bits = 0;
  let value = 0;
  let out = '';
  for (const b of bytes) {
    value = (value << 8) | b;
    bits += 8;
    while (bits >= 5) {
      out += B32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += B32[(value << (5 - bits)) & 31];
  return out;
}

/** letagents safety number: base32 of the first 20 bytes of SHA-256(sig ‖ box), groups of 4. */
export async function letagentsSafetyNumber(sig: Uint8Array, boxk: Uint8Array): Promise<string | null> {
  if (!globalThis.crypto?.subtle) return null;
  const both = new Uint8Array(64);
  both.set(sig, 0);
  both.set(boxk, 32);
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', both));
  const text = base32(digest.slice(0, 20));
  return text.match(/.{1,4}/g)?.join(' ') ?? text;
}

/** Recognises `text`, or returns null. */
export function recognise(raw: string): Recognised | null {
  let text = raw.trim();
  if (text.toLowerCase().startsWith('switchboard:')) {
    text = decodeURIComponent(text.slice('switchboard:'.length).replace(/^\/\//, ''));
  }
  if (!text || text.length > 4096 || /\s/.test(text)) return null;

  // Switchboard contact link: sb1.<payload>.<signature>, every address of one person. Only the
  // preview is read here; the runtime verifies the signature and every field when it is added.
  const sb = /^sb1\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]{86})$/.exec(text);
  if (sb) {
    const payload = b64uDecode(sb[1]);
    if (!payload) return null;
    const lines = new TextDecoder().decode(payload).split('\n');
    if (lines[0] !== 'switchboard contact v1') return null;
    const value = (key: string) => lines.find((l) => l.startsWith(`${key} `))?.slice(key.length + 1);
    const channels = ['letagents', 'agent_mail', 'stringcup'].filter((k) => value(k) !== undefined);
    const name = value('name');
    return {
      protocol: 'switchboard',
      what: `Switchboard contact link (${channels.length} channels)`,
      value: `switchboard:${text}`,
      action: 'add',
      fields: [
        ['Name', name ?? ''],
        ['Channels', channels.map((c) => c.replace('_', ' ')).join(', ')],
      ],
      suggestedName: name?.replace(/\./g, ' ').slice(0, 48),
      fingerprint: Promise.resolve(value('safety') ?? null),
    };
  }

  // letagents: la1.<sig>.<box>[.<drop>]
  const la = /^la1\.([A-Za-z0-9_-]{43})\.([A-Za-z0-9_-]{43})(?:\.([A-Za-z0-9_-]{22}))?$/.exec(text);
  if (la) {
    const sig = b64uDecode(la[1]);
    const boxk = b64uDecode(la[2]);
    if (!sig || !boxk || sig.length !== 32 || boxk.length !== 32) return null;
    return {
      protocol: 'letagents',
      what: la[3] ? 'letagents address' : 'letagents address without drop code (cannot be added)',
      value: text,
      action: 'add',
      fields: [['Mailbox', la[1]]],
      fingerprint: letagentsSafetyNumber(sig, boxk),
    };
  }

  // Stringcup: identity id or rendezvous token.
  if (/^sc-[a-z2-7]{24}$/.test(text)) {
    return { protocol: 'stringcup', what: 'Stringcup identity', value: text, action: 'add', fields: [['ID', text]] };
  }
  if (/^rv-[A-Za-z0-9]{32}$/.test(text)) {
    return {
      protocol: 'stringcup',
      what: 'Stringcup rendezvous token',
      value: text,
      action: 'pair',
      fields: [['Token', text]],
    };
  }

  // Agent Mail: did:agent:<key>/mail/<mailbox>[?route=<origin>...]
  const am = /^did:agent:([A-Za-z0-9_-]{43})\/mail\/([A-Za-z0-9_-]{22})(\?.*)?$/.exec(text);
  if (am) {
    const routes = new URLSearchParams(am[3]?.slice(1) ?? '').getAll('route');
    return {
      protocol: 'agent_mail',
      what: routes.length ? 'Agent Mail contact address' : 'Agent Mail stable address',
      value: text,
      action: 'add',
      fields: [
        ['Agent ID', `did:agent:${am[1]}`],
        ['Mailbox', am[2]],
        ...routes.map((r): [string, string] => ['Route', r]),
      ],
    };
  }

  // letmeknow: https://host/i/<id>#<secret>
  try {
    const u = new URL(text);
    const m = /^\/i\/([A-Za-z0-9_-]+)$/.exec(u.pathname);
    if ((u.protocol === 'https:' || u.protocol === 'http:') && m && u.hash.length > 1) {
      return {
        protocol: 'letmeknow',
        what: 'letmeknow group invite',
        value: text,
        action: 'join',
        fields: [['Relay', u.host]],
        inviter: fragmentParam(u.hash, 'from'),
        groupName: fragmentParam(u.hash, 'group'),
      };
    }
  } catch {
    /* not a URL */
  }
  return null;
}
