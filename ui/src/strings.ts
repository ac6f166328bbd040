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
    fingerprint: 'Safety number',
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
    noUnread: 'No unread messages.',
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
    approveName: (name: string) => `Name for ${name}`,
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
      `The members will see your name${me ? ` (${me})` : ''} and your safety number. The group\u2019s messages go through ${relay}, end-to-end encrypted.`,
    join: 'Join group',
    waiting: (inviter?: string) => `Waiting for ${inviter ?? 'the person who invited you'} to let you in\u2026 (their app must be running)`,
    joined: (name: string) => (name ? `You joined \u201c${name}\u201d.` : 'You joined the group.'),
    trustTitle: 'Trust this relay?',
    trust: (url: string) =>
      `The group lives on a relay at ${url} whose certificate no contact of yours has vouched for. Trust it only if the person who hosts it reads you the same fingerprint:`,
    trustFingerprint: 'Certificate SHA-256',
    trustAndJoin: 'Trust this relay and join',
  },
  preview: {
    title: 'Add this contact?',
    protocol: 'Protocol',
    kind: 'What it is',
    name: 'Name for this contact',
    fingerprint: 'Safety number',
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
    attach: 'Attach',
    attachments: 'Files',
    chosenFiles: 'Files to send',
    unnamedFile: 'unnamed file',
    save: 'Save\u2026',
    saveFile: (name: string) => `Save ${name}\u2026`,
    removeFile: (name: string) => `Remove ${name}`,
    hint: 'Enter to send \u00b7 Shift+Enter for a new line \u00b7 Alt+Shift+\u2193 next unread',
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
    movedIn: (name: string, url: string) => `${name} moved to the relay at ${url}`,
    movedOut: (url: string) => `You told them you moved to ${url}`,
    fromAgent: (agent: string) => `from ${agent}`,
    toAgent: (agent: string) => `to ${agent}`,
    /** An incoming message addressed to one of the owner's agents. */
    forMyAgent: (agent: string) => `for your agent ${agent}`,
    /** How far it got to that agent. */
    handout: {
      queued: (a: string) => `waiting for ${a}`,
      paused: (a: string) => `held from ${a} (loop guard)`,
      handed: (a: string) => `handed to ${a}`,
      delivered: (a: string) => `handed to ${a} · read`,
      skipped: (a: string) => `not handed to ${a}`,
    } as Record<string, (agent: string) => string>,
    /** Before the agent's state is known (no local agent by that name). */
    notMine: (a: string) => `for ${a}`,
    outbound: 'Messages my agents write to this contact',
    outboundModes: (global: string) =>
      ({ default: `Follow Settings (now: ${global})`, auto: 'Send at once', review: 'Hold for my review' }) as Record<string, string>,
    outboundGlobal: { auto: 'send at once', review: 'hold for review' } as Record<string, string>,
    outboundSaved: (name: string, mode: string) =>
      mode === 'review'
        ? `Messages your agents write to ${name} now wait for your review.`
        : mode === 'auto'
          ? `Messages your agents write to ${name} are now sent at once.`
          : `Messages your agents write to ${name} follow Settings.`,
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
  channels: {
    title: 'Channels',
    intro: 'Messages go on the first reachable channel; replies go back on the channel they came from.',
    label: { letagents: 'letagents', 'agent-mail': 'Agent Mail', stringcup: 'Stringcup' } as Record<string, string>,
    reachable: 'reachable',
    unreachable: 'unreachable',
    via: (channel: string) => `via ${channel}`,
    movedFrom: (channel: string) => `moved from ${channel}`,
    movedTitle: (channel: string) => `${channel} could not deliver it, so the next channel carried it`,
    split: 'Make a separate contact',
    splitDone: (channel: string) => `${channel} is now a separate contact.`,
  },
  merge: {
    start: 'Same person as',
    compare: 'Compare safety numbers',
    title: (a: string, b: string) => `Are ${a} and ${b} the same person?`,
    intro:
      'Compare both safety numbers with them over a channel you trust. Only if both are theirs, make them one contact: one conversation, every channel.',
    same: 'They are the same person',
    done: (a: string) => `${a} is now one contact.`,
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
    intro: 'A group is a conversation with several people, end-to-end encrypted (letmeknow). Its details show every member\u2019s safety number and who added them.',
    empty: 'No groups yet. Create one above, or paste an invite link someone sent you anywhere in this window.',
    newGroup: 'New group',
    create: 'Create group',
    createHint: 'The name is yours: members do not see it, and you can change it. Next you get an invite link to send.',
    created: (name: string) => `Created \u201c${name}\u201d. Send the invite link to the person you want in it.`,
    unnamed: 'New group',
    /** An unnamed group, by its other members ("Group with" keeps it apart from a 1:1 chat with one of them). */
    withMembers: (names: string[]) =>
      `Group with ${names.length <= 3 ? names.join(', ') : `${names.slice(0, 3).join(', ')} +${names.length - 3}`}`,
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
    fingerprint: 'Safety number',
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
    hint: 'Enter to send \u00b7 Shift+Enter for a new line \u00b7 @name addresses a member',
    mentionsYou: '@you',
    mentionTitle: (name: string) => `Addressed to ${name}`,
  },
  review: {
    title: 'Review queue',
    onIntro: 'Review mode is on: messages your agents write wait here until you approve them.',
    offIntro: 'Review mode is off: your agents\u2019 messages are sent at once (a contact or group can still hold them).',
    change: 'Change in Settings',
    empty: 'Nothing is waiting for review.',
    approve: 'Approve and send',
    edit: 'Edit',
    editLabel: 'Text to send',
    approveEdited: 'Send as edited',
    cancelEdit: 'Cancel',
    approvedEdited: (to: string) => `Approved with your changes: sent to ${to}.`,
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
    moveTitle: 'Move to another relay',
    moveNote: (current: string) =>
      `Your addresses live on ${current}. Moving gives you addresses on the new relay; your contacts are told where you went, groups and Stringcup contacts stay where they are (still reached through this relay), and this relay is still read for 48 hours.`,
    moveConfirm: (p: { told: number; stringcup: number; groups: number; drain_hours: number }) => {
      const told = p.told;
      const contacts = `${told} ${told === 1 ? 'contact' : 'contacts'} will be told`;
      // A Stringcup id belongs to the relay that assigned it: those contacts stay there.
      const who = p.stringcup === 1 ? 'does 1 Stringcup contact' : `do ${p.stringcup} Stringcup contacts`;
      const stringcup = p.stringcup > 0 ? `, and so ${who} (a Stringcup id belongs to the relay that assigned it)` : '';
      const groups = `${p.groups} ${p.groups === 1 ? 'group stays' : 'groups stay'} on the old relay${stringcup}`;
      return `${contacts}; ${groups}; the old relay is read for ${p.drain_hours} h.`;
    },
    moveConfirmTitle: (url: string) => `Move to ${url}?`,
    moveConfirmButton: 'Move now',
    moveCancel: 'Cancel',
    moveUrl: 'New relay URL',
    moveCert: 'Certificate SHA-256 (only for a self-signed relay)',
    moveButton: 'Move',
    moveChecking: 'Checking the new relay…',
    moved: (url: string) => `Moved to ${url}. Share your new addresses from My addresses.`,

    moveDown: (why: string) =>
      `Nothing changed: Switchboard could not reach that relay. ${why.replace(/^relay unreachable: /, '').replace(/^./, (c) => c.toUpperCase())}.`,
    lastError: 'Last error',
    relayColumns: ['Relay', 'Used for', 'Connection'],
    relayOwn: 'Your relay',
    relayPeople: (n: number) => (n === 1 ? '1 contact writes to you here' : `${n} contacts write to you here`),
    relayStringcup: (n: number) => (n === 1 ? '1 Stringcup contact' : `${n} Stringcup contacts`),
    relayGroups: (n: number) => (n === 1 ? "1 group's messages" : `${n} groups' messages`),
    relayDraining: (until: string) => `Moved away: still read until ${until}`,
    relayPolled: 'Checked every few seconds',
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
    shortcuts: 'Keyboard shortcuts',
    shortcutList: [
      ['Ctrl+F', 'Search messages'],
      ['Ctrl+M', 'Go to the message box'],
      ['Alt+Shift+↓', 'Next chat with unread messages'],
      ['Alt+↓ / Alt+↑', 'Next / previous chat'],
      ['Enter', 'Send (Shift+Enter: a new line)'],
      ['Escape', 'Cancel a reply or clear the search'],
    ] as [string, string][],
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
    // Bad input, a name already taken, numbers not compared: the runtime's own sentence says which.
    if ((code === 'invalid_input' || code === 'contact_exists' || code === 'safety_number_unconfirmed') && message)
      return sentence(message);
    return S.errors.byCode[code] ?? (message ? sentence(message) : S.errors.unexpected);
  },
  unread: (n: number) => (n === 1 ? '1 unread' : `${n} unread`),
  asnet: {
    title: 'Agent network',
    intro:
      'ASNET is a network of agents run over email: a service mailbox keeps who is connected to whom, and every change is confirmed from your own mailbox. Switchboard sends the commands from your mailbox and reads the service\u2019s answers there.',
    setupTitle: 'Set up your account',
    setupIntro: 'The service\u2019s address comes from whoever runs the network. Your mailbox is an ordinary email account you control.',
    service: 'Service address',
    mailbox: 'Your mailbox',
    username: 'Login (if not the address)',
    usernameHint: 'same as the mailbox',
    password: 'Password',
    passwordNote: 'The password is kept in this device\u2019s keystore, never in the database or a log.',
    smtp: 'Sending server (SMTP)',
    imap: 'Reading server (IMAP)',
    smtpTls: 'Sending security',
    imapTls: 'Reading security',
    tlsName: (t: string) => ({ tls: 'TLS', starttls: 'STARTTLS', none: 'None (this machine only)' })[t] ?? t,
    setupButton: 'Save account',
    setUp: 'Account saved.',
    accountLine: (mailbox: string, service: string) => `${mailbox} on ${service}.`,
    lastRead: (when: string) => `Mailbox read ${when}.`,
    syncFailed: (why: string) => `Reading the mailbox failed: ${why}`,
    challengesWaiting: (n: number) =>
      n === 1 ? 'The service asks you to confirm 1 action.' : `The service asks you to confirm ${n} actions.`,
    openReview: 'Open the review queue',
    membership: 'Membership',
    memberIs: 'Your member id:',
    discoverable: 'others can find it',
    notRegistered: 'Not registered yet.',
    discoveryLabel: 'Let other members find me',
    register: 'Register',
    reRegister: 'Register again',
    asked: 'Sent. The service will ask you to confirm it: approve it in the review queue.',
    connectTitle: 'Connect to a member',
    memberId: 'Member id',
    scopesToOffer: 'What to share',
    scopesToGrant: 'What to share (the same or less)',
    scopeName: (s: string) => ({ 'contact:email': 'email address', 'profile:basic': 'basic profile' })[s] ?? s,
    connect: 'Ask to connect',
    lookupLabel: 'Look a member up',
    lookup: 'Look up',
    lookupSent: 'Asked. The answer comes by mail and shows under Activity.',
    invitations: 'Invitations',
    invitationFrom: 'From',
    expires: (when: string) => `expires ${when}`,
    accepting: 'Accepting: waiting for your confirmation in the review queue.',
    accept: 'Accept',
    ignoreNote: 'An invitation you do not accept expires by itself.',
    connections: 'Connections',
    noConnections: 'No connections yet.',
    disconnect: 'Disconnect',
    refreshList: 'Ask the service for the list',
    activity: 'Activity',
    noActivity: 'Nothing asked yet.',
    requestState: (s: string) =>
      ({ sent: 'sent', challenged: 'waiting for you', verified: 'confirmed', rejected: 'rejected', expired: 'expired' })[s] ?? s,
    askedBy: (agent: string) => `(asked by ${agent})`,
    lookups: (n: number) => (n === 1 ? '1 lookup answer' : `${n} lookup answers`),
    warnings: (n: number) => (n === 1 ? '1 warning' : `${n} warnings`),
    settingsTitle: 'Agent network (ASNET)',
    settingsNote: 'Connect with other people\u2019s agents through an ASNET service over email.',
    settingsOpen: 'Open the agent network',
  },
};

/** `text` as a sentence: a capital first letter and a full stop. */
function sentence(text: string): string {
  const t = text.trim();
  if (!t) return t;
  const first = t.charAt(0).toUpperCase() + t.slice(1);
  return /[.!?]$/.test(first) ? first : `${first}.`;
}
