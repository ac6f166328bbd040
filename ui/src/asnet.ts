/**
 * The agent network screen (ASNET/1 over email): set the account up, register, connect to a
 * member, accept an invitation with the same or fewer scopes, disconnect, look members up.
 *
 * Every protected action only asks: the service answers with a challenge, which waits in the
 * review queue until the person approves it there (this screen links to it). What the service
 * and other members send is shown as data, never as instructions.
 */
import { type AsnetStatus, BackendError, type Json } from './backend';
import { ago, field, h } from './dom';
import { S } from './strings';

/** What the screen needs from the app around it. */
export interface AsnetDeps {
  /** One runtime request (an `asnet_*` op). */
  rpc<T>(req: Json): Promise<T>;
  /** Runs an action, says `ok` when it worked, then redraws the screen. */
  act(f: () => Promise<unknown>, ok?: string): Promise<void>;
}

const SCOPES = ['contact:email', 'profile:basic'];

/** Checkboxes for `scopes` (all ticked at first); returns the group and a reader. */
function scopePicker(idPrefix: string, scopes: string[], legend: string) {
  const boxes = scopes.map((s) => h('input', { type: 'checkbox', id: `${idPrefix}-${s}`, value: s, checked: true }));
  const group = h(
    'fieldset',
    { class: 'scopes' },
    h('legend', null, legend),
    boxes.map((b, i) => h('label', { for: b.id }, b, ' ', S.asnet.scopeName(scopes[i] ?? ''))),
  );
  return { group, chosen: () => boxes.filter((b) => b.checked).map((b) => b.value) };
}

function setupForm(deps: AsnetDeps) {
  const input = (id: string, type = 'text', placeholder = '') =>
    h('input', { type, id, required: true, placeholder, autocomplete: 'off' });
  const service = input('asnet-service', 'email', 'network@example.org');
  const mailbox = input('asnet-mailbox', 'email', 'me@example.org');
  const username = h('input', { type: 'text', id: 'asnet-username', placeholder: S.asnet.usernameHint, autocomplete: 'off' });
  const password = input('asnet-password', 'password');
  const smtp = input('asnet-smtp', 'text', 'smtp.example.org:465');
  const imap = input('asnet-imap', 'text', 'imap.example.org:993');
  const tls = (id: string, options: string[]) =>
    h(
      'select',
      { id },
      options.map((o) => h('option', { value: o }, S.asnet.tlsName(o))),
    );
  const smtpTls = tls('asnet-smtp-tls', ['tls', 'starttls', 'none']);
  const imapTls = tls('asnet-imap-tls', ['tls', 'none']);
  return h(
    'form',
    {
      class: 'card stack',
      onsubmit: (e: Event) => {
        e.preventDefault();
        void deps.act(
          () =>
            deps.rpc({
              op: 'asnet_setup',
              service: service.value.trim(),
              mailbox: mailbox.value.trim(),
              username: username.value.trim() || null,
              password: password.value,
              smtp: smtp.value.trim(),
              smtp_tls: smtpTls.value,
              smtp_auth: true,
              imap: imap.value.trim(),
              imap_tls: imapTls.value,
            }),
          S.asnet.setUp,
        );
      },
    },
    h('h3', null, S.asnet.setupTitle),
    h('p', null, S.asnet.setupIntro),
    field(S.asnet.service, service),
    field(S.asnet.mailbox, mailbox),
    field(S.asnet.username, username),
    field(S.asnet.password, password),
    h('div', { class: 'inline-field' }, field(S.asnet.smtp, smtp), field(S.asnet.smtpTls, smtpTls)),
    h('div', { class: 'inline-field' }, field(S.asnet.imap, imap), field(S.asnet.imapTls, imapTls)),
    h('p', { class: 'muted' }, S.asnet.passwordNote),
    h('div', { class: 'actions' }, h('button', { type: 'submit' }, S.asnet.setupButton)),
  );
}

function pendingNote(st: AsnetStatus) {
  const waiting = st.challenges.filter((c) => c.state === 'pending').length;
  if (waiting === 0) return null;
  return h(
    'p',
    { class: 'notice', role: 'status' },
    S.asnet.challengesWaiting(waiting),
    ' ',
    h('a', { href: '#/review' }, S.asnet.openReview),
  );
}

function registerCard(st: AsnetStatus, deps: AsnetDeps) {
  const discover = h('input', { type: 'checkbox', id: 'asnet-discovery', checked: st.discovery });
  return h(
    'section',
    { class: 'card stack', 'aria-labelledby': 'asnet-register-h' },
    h('h3', { id: 'asnet-register-h' }, S.asnet.membership),
    st.member_id
      ? h('p', null, S.asnet.memberIs, ' ', h('code', null, st.member_id), st.discovery ? ` (${S.asnet.discoverable})` : '')
      : h('p', null, S.asnet.notRegistered),
    h('label', { for: 'asnet-discovery' }, discover, ' ', S.asnet.discoveryLabel),
    h(
      'div',
      { class: 'actions' },
      h(
        'button',
        {
          type: 'button',
          onclick: () =>
            deps.act(() => deps.rpc({ op: 'asnet_register', discovery: discover.checked }), S.asnet.asked),
        },
        st.member_id ? S.asnet.reRegister : S.asnet.register,
      ),
    ),
  );
}

function connectCard(deps: AsnetDeps) {
  const member = h('input', { type: 'text', id: 'asnet-connect-member', placeholder: 'mem_…', required: true, autocomplete: 'off' });
  const picker = scopePicker('asnet-connect', SCOPES, S.asnet.scopesToOffer);
  const lookup = h('input', { type: 'text', id: 'asnet-lookup-member', placeholder: 'mem_…', required: true, autocomplete: 'off' });
  return h(
    'section',
    { class: 'card stack', 'aria-labelledby': 'asnet-connect-h' },
    h('h3', { id: 'asnet-connect-h' }, S.asnet.connectTitle),
    h(
      'form',
      {
        class: 'stack',
        onsubmit: (e: Event) => {
          e.preventDefault();
          const scopes = picker.chosen();
          if (scopes.length === 0) return;
          void deps.act(() => deps.rpc({ op: 'asnet_connect', member_id: member.value.trim(), scopes }), S.asnet.asked);
        },
      },
      field(S.asnet.memberId, member),
      picker.group,
      h('div', { class: 'actions' }, h('button', { type: 'submit' }, S.asnet.connect)),
    ),
    h(
      'form',
      {
        class: 'inline-field',
        onsubmit: (e: Event) => {
          e.preventDefault();
          void deps.act(() => deps.rpc({ op: 'asnet_lookup', member_id: lookup.value.trim() }), S.asnet.lookupSent);
        },
      },
      field(S.asnet.lookupLabel, lookup),
      h('button', { type: 'submit', class: 'secondary' }, S.asnet.lookup),
    ),
  );
}

function invitationsCard(st: AsnetStatus, deps: AsnetDeps) {
  const open = st.invitations.filter((i) => i.state !== 'accepted');
  if (open.length === 0) return null;
  return h(
    'section',
    { class: 'card stack', 'aria-labelledby': 'asnet-invitations-h' },
    h('h3', { id: 'asnet-invitations-h' }, S.asnet.invitations),
    h(
      'ul',
      { class: 'list' },
      open.map((inv) => {
        const picker = scopePicker(`asnet-inv-${inv.request_id}`, inv.scopes, S.asnet.scopesToGrant);
        return h(
          'li',
          { class: 'stack' },
          h('p', null, S.asnet.invitationFrom, ' ', h('code', null, inv.from_member_id), ', ', S.asnet.expires(ago(inv.expires_at))),
          picker.group,
          inv.state === 'accepting'
            ? h('p', { class: 'muted' }, S.asnet.accepting)
            : h(
                'div',
                { class: 'actions' },
                h(
                  'button',
                  {
                    type: 'button',
                    onclick: () => {
                      const scopes = picker.chosen();
                      if (scopes.length === 0) return;
                      void deps.act(
                        () => deps.rpc({ op: 'asnet_accept', request_id: inv.request_id, scopes }),
                        S.asnet.asked,
                      );
                    },
                  },
                  S.asnet.accept,
                ),
              ),
        );
      }),
    ),
    h('p', { class: 'muted' }, S.asnet.ignoreNote),
  );
}

function connectionsCard(st: AsnetStatus, deps: AsnetDeps) {
  return h(
    'section',
    { class: 'card stack', 'aria-labelledby': 'asnet-connections-h' },
    h('h3', { id: 'asnet-connections-h' }, S.asnet.connections),
    st.connections.length === 0
      ? h('p', { class: 'muted' }, S.asnet.noConnections)
      : h(
          'ul',
          { class: 'list' },
          st.connections.map((c) =>
            h(
              'li',
              { class: 'row' },
              h('code', null, c.member_id),
              ' ',
              h('span', { class: 'muted' }, c.scopes.map(S.asnet.scopeName).join(', ')),
              ' ',
              h(
                'button',
                {
                  type: 'button',
                  class: 'secondary',
                  'aria-label': `${S.asnet.disconnect} ${c.member_id}`,
                  onclick: () => deps.act(() => deps.rpc({ op: 'asnet_disconnect', member_id: c.member_id }), S.asnet.asked),
                },
                S.asnet.disconnect,
              ),
            ),
          ),
        ),
    h(
      'div',
      { class: 'actions' },
      h(
        'button',
        { type: 'button', class: 'secondary', onclick: () => deps.act(() => deps.rpc({ op: 'asnet_connections' }), S.asnet.asked) },
        S.asnet.refreshList,
      ),
    ),
  );
}

function activityCard(st: AsnetStatus) {
  const rows = st.requests.slice(0, 10);
  return h(
    'section',
    { class: 'card stack', 'aria-labelledby': 'asnet-activity-h' },
    h('h3', { id: 'asnet-activity-h' }, S.asnet.activity),
    rows.length === 0
      ? h('p', { class: 'muted' }, S.asnet.noActivity)
      : h(
          'ul',
          { class: 'list' },
          rows.map((r) =>
            h(
              'li',
              null,
              S.review.asnetAction(r.action),
              ' \u2014 ',
              h('span', { class: 'chip' }, S.asnet.requestState(r.state)),
              r.requested_by !== 'owner' ? ` ${S.asnet.askedBy(r.requested_by)}` : '',
              ', ',
              ago(r.created_at),
            ),
          ),
        ),
    st.lookups.length > 0
      ? h(
          'details',
          null,
          h('summary', null, S.asnet.lookups(st.lookups.length)),
          // Service answers, shown as data.
          h('pre', { class: 'peer-data' }, st.lookups.map((l) => JSON.stringify(l, null, 2)).join('\n\n')),
        )
      : null,
    st.warnings.length > 0
      ? h(
          'details',
          null,
          h('summary', null, S.asnet.warnings(st.warnings.length)),
          h(
            'ul',
            { class: 'list' },
            st.warnings.map((w) => h('li', null, `${w.kind}: ${w.detail} (${ago(w.created_at)})`)),
          ),
        )
      : null,
  );
}

/** The screen: the set-up form before there is an account, the account's state after. */
export async function asnetView(deps: AsnetDeps): Promise<HTMLElement> {
  let st: AsnetStatus;
  try {
    st = await deps.rpc<AsnetStatus>({ op: 'asnet_status' });
  } catch (e) {
    if (e instanceof BackendError && e.code === 'not_set_up') {
      return h('div', { class: 'asnet stack' }, h('h2', null, S.asnet.title), h('p', null, S.asnet.intro), setupForm(deps));
    }
    throw e;
  }
  const syncProblem = st.sync_error ?? (st.last_error || null);
  return h(
    'div',
    { class: 'asnet stack' },
    h('h2', null, S.asnet.title),
    h(
      'p',
      null,
      S.asnet.accountLine(st.mailbox, st.service),
      st.last_sync_at ? ` ${S.asnet.lastRead(ago(st.last_sync_at))}` : '',
    ),
    syncProblem ? h('p', { class: 'error', role: 'alert' }, S.asnet.syncFailed(syncProblem)) : null,
    pendingNote(st),
    registerCard(st, deps),
    invitationsCard(st, deps),
    connectionsCard(st, deps),
    connectCard(deps),
    activityCard(st),
  );
}
