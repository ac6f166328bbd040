// Every user-visible string of the UI, in one place.

export const S = {
  appName: 'Switchboard',
  loading: 'Loading…',
  nav: {
    label: 'Main',
    contacts: 'Chats',
    agents: 'Agents',
    review: 'Review',
    groups: 'Groups',
    log: 'Activity',
    settings: 'Settings',
    me: 'My addresses',
  },
  firstRun: {
    title: 'Welcome to Switchboard',
    intro: 'Create this device\u2019s identity. Keys are made here and never leave it.',
    name: 'Your name, as contacts see it',
    relayLegend: 'Relay',
    relayUrl: 'Use a relay at this URL',
    relayUrlField: 'Relay URL',
    relayHost: 'Host one on this machine',
    relayHostNote:
      'Switchboard runs a relay inside the app (HTTPS with its own certificate, port 8471 on every network interface). People on your network use it by its URL and certificate fingerprint, shown in Settings.',
    create: 'Create identity',
    creating: 'Creating…',
    done: 'Your identity is ready',
    relayDown: (why: string) =>
      `No identity was made yet: Switchboard could not reach the relay. ${why.replace(/^relay unreachable: /, '').replace(/^./, (c) => c.toUpperCase())}. Check the URL (and that the relay is running), then try again.`,
    continue: 'Continue',
  },
  me: {
    title: 'My addresses',
    intro: 'Share an address with someone you trust; compare safety numbers in person or on a call.',
    address: 'Address',
    safety: 'Safety number',
    fingerprint: 'Fingerprint',
    relay: 'Relay',
    copy: 'Copy',
    copied: 'Copied',
    qr: (proto: string) => `QR code of your ${proto} address`,
  },
  chats: {
    title: 'Chats',
    noMessages: 'No messages yet',
    you: (text: string) => `You: ${text}`,
    choose: 'Choose a conversation. To add a contact, paste their address anywhere in this window.',
  },
  search: {
    label: 'Search messages',
    placeholder: 'Search messages (Ctrl+F)',
    hint: 'Ctrl+F from anywhere. Escape clears the search.',
    results: 'Messages found',
    count: (n: number, q: string) => (n === 1 ? `1 message with \u201c${q}\u201d.` : `${n} messages with \u201c${q}\u201d.`),
    local: (n: number) => `Searched on this device, in the last ${n} messages of each conversation.`,
  },
  contacts: {
    title: 'Contacts',
    add: 'Add a contact',
    approved: (name: string) => `${name} is now a contact.`,
    empty: 'No contacts yet. Paste an address anywhere in this window to add one.',
    pending: 'Requests',
    pendingEmpty: 'No pending requests.',
    says: (text: string) => `says \u201c${text}\u201d`,
    approve: 'Approve',
    deny: 'Deny',
    verified: 'Verified',
    unverified: 'Not verified',
    keyChanged: 'Key changed',
    blocked: 'Blocked',
    block: 'Block',
    unblock: 'Unblock',
    blockedDone: (name: string) => `${name} is blocked. What they send is dropped.`,
    unblockedDone: (name: string) => `${name} is no longer blocked.`,
    blockedDropped: (n: number) => (n === 1 ? '1 message dropped while blocked.' : `${n} messages dropped while blocked.`),
    blockedBanner: 'You blocked this contact: nothing is sent to them and what they send is dropped.',
    senderAuth: {
      signed_end_to_end: 'Sender signed end to end: the relay cannot forge who sent a message.',
      asserted_by_relay:
        'Sender asserted by the relay, not authenticated end to end: the relay could forge who sent a message. The safety number protects what you send them.',
    } as Record<string, string>,
    nearby: 'Nearby',
    nearbyTitle: 'On your local network: messages go directly, the relay is the fallback',
    open: (name: string) => `Open conversation with ${name}`,
    pasteHint: 'Paste an address, ID, rendezvous token or invite link:',
    pasteField: 'Address to add',
    preview: 'Preview',
  },
  join: {
    title: 'Join group?',
    who: (inviter?: string, group?: string) =>
      inviter && group
        ? `${inviter} invited you to \u201c${group}\u201d.`
        : inviter
          ? `${inviter} invited you to a group.`
          : group
            ? `You are invited to \u201c${group}\u201d.`
            : 'You are invited to a group.',
    note: (me: string, relay: string) =>
      `The members will see your name${me ? ` (${me})` : ''} and your fingerprint. The group\u2019s messages go through ${relay}, end-to-end encrypted.`,
    join: 'Join group',
    waiting: (inviter?: string) => `Waiting for ${inviter ?? 'the person who invited you'} to let you in\u2026 (their app must be running)`,
    joined: (name: string) => (name ? `You joined \u201c${name}\u201d.` : 'You joined the group.'),
  },
  preview: {
    title: 'Add this contact?',
    protocol: 'Protocol',
    kind: 'What it is',
    name: 'Name for this contact',
    fingerprint: 'Fingerprint',
    relay: 'Relay',
    add: 'Add contact',
    join: 'Join',
    cancel: 'Cancel',
    notRecognised:
      'Nothing to add: that is not an address, ID, pairing token or invite link Switchboard knows. Ask your contact to copy their full address from \u201cMy addresses\u201d.',
    unsupported: (proto: string) => `This runtime cannot add ${proto} contacts yet.`,
    added: (name: string) => `Added ${name}.`,
  },
  conversation: {
    title: (name: string) => `Conversation with ${name}`,
    direct: 'Direct',
    directTitle: 'Carried directly over the local network, not through a relay',
    titlePrefix: 'Conversation with ',
    empty: 'No messages yet. Say hello.',
    compose: 'Message',
    placeholder: 'Write a message',
    hint: 'Enter to send \u00b7 Shift+Enter for a new line',
    logHint: 'Up and down arrows move between messages you can reply to.',
    kind: 'My messages are',
    kindHint: 'A question asks their agent to answer.',
    kinds: { send: 'messages', ask: 'questions', reply: 'reply', list: 'who is online', hello: 'hello' } as Record<string, string>,
    kindBadge: { ask: 'question', list: 'who is online?', hello: 'hello', reply: 'reply' } as Record<string, string>,
    send: 'Send',
    replyTo: (text: string) => `Replying to \u201c${text.length > 60 ? `${text.slice(0, 60)}\u2026` : text}\u201d`,
    reply: 'Reply',
    cancelReply: 'Cancel reply',
    me: 'me',
    helloOut: 'You asked to be contacts',
    helloIn: (name: string) => `${name} asked to be contacts`,
    fromAgent: (agent: string) => `from ${agent}`,
    toAgent: (agent: string) => `to ${agent}`,
    blockedPending: 'This contact is a pending request: approve it before sending.',
    allowed: 'They may send me',
    saveAllowed: 'Save',
    verify: 'Verify',
    details: (name: string) => `About ${name}`,
    detailsButton: 'Details',
    closeDetails: 'Close',
    back: 'Back to chats',
    mute: 'Mute notifications for this conversation',
  },
  connection: {
    down: (host: string, since: string) => `Can\u2019t reach the relay ${host}${since ? ` (since ${since})` : ''}.`,
    queued: (n: number) =>
      n === 0
        ? 'Messages you send wait here and go out when it is back.'
        : `${n === 1 ? '1 message waits' : `${n} messages wait`} here and will go out when it is back.`,
  },
  ticks: {
    queued: 'Queued: not sent yet',
    relayed: 'Sent to the relay',
    delivered: 'Delivered',
    refused: 'Refused by the recipient',
    failed: 'Not sent',
  },
  verify: {
    title: (name: string) => `Verify ${name}`,
    intro: 'Compare both numbers with your contact over a channel you trust. They must match exactly.',
    yours: 'Your safety number',
    theirs: (name: string) => `${name}\u2019s safety number`,
    theirsNew: (name: string) => `${name}\u2019s new safety number`,
    mark: 'Mark verified',
    done: 'Verified.',
    qr: (who: string) => `QR code of ${who}`,
  },
  keyChange: {
    banner: (name: string) =>
      `${name}\u2019s key changed. Sending is blocked until you compare the new safety number and re-verify.`,
    action: 'Compare and re-verify',
  },
  agents: {
    title: 'Local agents',
    empty: 'No agents are registered.',
    name: 'Name',
    harness: 'Harness',
    status: 'Status',
    where: 'Where',
    updated: 'Updated',
  },
  status: {
    title: 'Runtime',
    pid: 'Process',
    profile: 'Profile',
    keystore: 'Keystore',
    outbox: 'Queued to send',
    bridge: 'Bridge',
  },
  groups: {
    title: 'Groups',
    intro: 'A group is a conversation with several people, end-to-end encrypted (letmeknow). Its details show every member\u2019s fingerprint and who added them.',
    empty: 'No groups yet. Create one above, or paste an invite link someone sent you anywhere in this window.',
    newGroup: 'New group',
    create: 'Create group',
    createHint: 'The name is yours: members do not see it, and you can change it. Next you get an invite link to send.',
    created: (name: string) => `Created \u201c${name}\u201d. Send the invite link to the person you want in it.`,
    unnamed: 'New group',
    withMembers: (names: string[]) => (names.length <= 3 ? names.join(', ') : `${names.slice(0, 3).join(', ')} +${names.length - 3}`),
    open: (name: string) => `Open group ${name}`,
    titlePrefix: 'Group: ',
    log: (name: string) => `Messages in ${name}`,
    compose: (name: string) => `Message to ${name}`,
    placeholder: (name: string) => `Message ${name}`,
    noMessages: 'No messages yet. Say hello.',
    membersCount: (n: number) => (n === 1 ? '1 member' : `${n} members`),
    details: 'Group details',
    nameField: 'Group name',
    nameHint: 'Only you see this name.',
    rename: 'Rename',
    renamed: 'Renamed.',
    alert: (text: string) => `Warning: ${text}`,
    inactive: (state: string) =>
      state === 'left'
        ? 'You left this group.'
        : state === 'removed'
          ? 'You were removed from this group.'
          : 'This device was offline longer than the relay keeps messages: ask a member to invite you again.',
    invite: 'Invite link',
    inviteHint: 'Send this link to one person: it lets one person in, once, while this app is running.',
    inviteUsed: (name: string) => `Used: ${name} joined with this link. It cannot be used again; make a new one for someone else.`,
    inviteExpired: 'This link expired before anyone used it.',
    inviteFailed: 'This link can no longer be used. Make a new one.',
    someone: 'someone',
    inviteTo: 'Invite someone',
    expiresIn: (s: number) => (s > 0 ? `expires in ${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}` : 'expired'),
    members: 'Members',
    name: 'Name',
    fingerprint: 'Fingerprint',
    invitedBy: 'Added by',
    you: '(you)',
    state: 'State',
    unread: 'Unread',
    joined: 'Joined the group.',
    mode: 'Agent messages to this group',
    modes: { default: 'Follow the review policy', auto: 'Send at once', review: 'Hold for my review' } as Record<string, string>,
    modeSaved: 'Saved.',
    paused: (hops: number, held: number) =>
      `Paused by the loop guard: ${hops} agent messages since you last took part; ${held} held.`,
    resume: 'Resume this group',
    resumed: 'Resumed.',
    mute: 'Mute notifications for this group',
  },
  review: {
    title: 'Review queue',
    onIntro: 'Review mode is on: messages your agents write wait here until you approve them.',
    offIntro: 'Review mode is off: your agents\u2019 messages are sent at once (a contact or group can still hold them).',
    change: 'Change in Settings',
    empty: 'Nothing is waiting for review.',
    approve: 'Approve and send',
    reject: 'Reject',
    approved: (to: string) => `Approved: sent to ${to}.`,
    rejected: 'Rejected: it will not be sent.',
    toGroup: (group: string, member: string | null) => `group ${group}${member ? ` (member ${member.slice(0, 9)})` : ''}`,
    waiting: (n: number) => (n === 1 ? '1 waiting' : `${n} waiting`),
    asnetTarget: 'the ASNET network',
    asnetChip: 'ASNET challenge',
    asnetIntro: 'The ASNET service asks you to confirm this action. Approving sends the confirmation code for exactly this:',
    asnetApproved: 'Approved: the confirmation is on its way to the ASNET service.',
    asnetExpires: (when: string) => `The challenge expires ${when}.`,
    asnetAction: (a: Record<string, unknown>) => {
      const scopes = Array.isArray(a.scopes) ? ` with ${(a.scopes as string[]).join(', ')}` : '';
      switch (a.command) {
        case 'REGISTER':
          return `Register your mailbox${a.discovery === true ? ' (discoverable)' : a.discovery === false ? ' (not discoverable)' : ''}`;
        case 'CONNECT':
          return `Connect to ${String(a.memberId)}${scopes}`;
        case 'ACCEPT':
          return `Accept invitation ${String(a.requestId)}${scopes}`;
        case 'DISCONNECT':
          return `Disconnect from ${String(a.memberId)}`;
        case 'LIST CONNECTIONS':
          return 'List your connections';
        default:
          return JSON.stringify(a);
      }
    },
  },
  log: {
    title: 'Activity log',
    search: 'Search the log',
    export: 'Export JSON',
    exportCsv: 'Export CSV',
    empty: 'No activity matches.',
    cols: ['When', 'Dir', 'Protocol', 'Peer', 'Kind', 'State', 'Detail'],
  },
  settings: {
    title: 'Settings',
    appearance: 'Appearance',
    theme: 'Theme',
    themes: { system: 'Same as the system', light: 'Light', dark: 'Dark' } as Record<string, string>,
    review: 'Review',
    reviewMode: 'Hold messages my agents write until I approve them',
    reviewNote: 'Held messages wait in the Review queue. A contact or group can have its own setting.',
    reviewOn: 'Review mode is on.',
    reviewOff: 'Review mode is off.',
    lan: 'Local network',
    lanMode: 'Find contacts on this network and deliver to them directly',
    lanNote: 'Off by default: when on, this device announces itself on every network it joins (with a daily key that does not identify you). Only your contacts are answered; the relay stays the fallback.',
    lanOn: 'The local network layer is on.',
    lanOff: 'The local network layer is off.',
    lanNearby: (names: string[]) => (names.length ? `Nearby now: ${names.join(', ')}` : 'No contact nearby now.'),
    relays: 'Relays',
    health: 'Health',
    lastError: 'Last error',
    notifications: 'Notifications',
    notify: 'Show system notifications for new messages',
    dnd: 'Do not disturb (pauses notifications and agent wakes)',
    hosted: 'Relay hosted by this app',
    hostedUrl: 'URL',
    hostedCert: 'Certificate SHA-256 (peers pin it)',
    hostedPort: 'Port (every interface)',
    hostedData: 'Data',
    hostedState: 'State',
    hostedAccepting: 'accepting connections',
    hostedDown: 'not running',
    hostedPeers: 'On another machine on this network:',
    tray: 'Tray',
    closeToTray: 'Closing the window keeps Switchboard running in the tray',
    startInTray: 'Start in the tray',
    trayOnlyDesktop: 'Tray settings apply to the desktop app.',
    saved: 'Saved.',
  },
  errors: {
    unexpected: 'Something went wrong in Switchboard. Try again; if it keeps happening, the activity log may say why.',
    byCode: {
      not_initialized: 'This profile has no identity yet.',
      already_initialized: 'This profile already has an identity.',
      unknown_contact: 'There is no contact by that name.',
      contact_exists: 'You already have a contact by that name or address.',
      key_changed: 'This contact\u2019s key changed. Compare safety numbers and verify again before sending.',
      pending_contact: 'This contact is still a request: approve it first.',
      unknown_message: 'That message is no longer here.',
      unknown_group: 'You are not in that group (any more).',
      store: 'Switchboard could not read or write its database on this device.',
      keystore: 'Switchboard could not open its keys in the system keyring.',
      relay: 'The relay could not be reached. Messages wait in the queue and go out when it is back.',
      profile: 'Switchboard could not open this profile\u2019s files.',
      internal: 'Something went wrong inside Switchboard.',
      forbidden: 'That is not allowed here.',
      loop_guard: 'The loop guard paused this conversation: take part in it to resume.',
      unreachable: 'Switchboard is not answering. Is the app (or `switchboard ui`) still running?',
      unsupported: 'This works in the desktop app only.',
      http: 'Switchboard answered with an error.',
    } as Record<string, string>,
    /** Runtime messages that name a command line where the app has a button. */
    rewrite: [
      [/no group session/i, 'You are not in any group yet: create one on the Groups screen, or paste an invite link.'],
    ] as [RegExp, string][],
  },
  /** The words for an error: a rewrite, the runtime's own sentence for bad input, else by code. */
  error: (code: string, message: string) => {
    for (const [re, text] of S.errors.rewrite) if (re.test(message)) return text;
    if (code === 'invalid_input' && message) return sentence(message);
    return S.errors.byCode[code] ?? (message ? sentence(message) : S.errors.unexpected);
  },
  unread: (n: number) => (n === 1 ? '1 unread' : `${n} unread`),
};

/** `text` as a sentence: a capital first letter and a full stop. */
function sentence(text: string): string {
  const t = text.trim();
  if (!t) return t;
  const first = t.charAt(0).toUpperCase() + t.slice(1);
  return /[.!?]$/.test(first) ? first : `${first}.`;
}
