// End-to-end: the real UI, served by a real `switchboard ui` runtime, in headless Chromium.
// Driven by tests/tests/ui_e2e.rs, which runs relay-lite and the other profiles and answers this
// script's requests: a line `REQ <json>` on stdout gets one line `RES <json>` on stdin.
//
// Environment: UI_URL (the single-use first-run link), RELAY_URL, BOB_ADDRESS, BOB_SAFETY,
// CAROL_NAME, MALLORY_ADDRESS, SHOT_DIR (screenshots), CHROMIUM (default /usr/bin/chromium).

import { assert, driver, env, inViewport, nav, newGroupInvite, readQr, scenario, scrollsSideways, shot, step } from './harness.mjs';

const UI_URL = env('UI_URL');
const RELAY_URL = env('RELAY_URL');
const BOB_ADDRESS = env('BOB_ADDRESS');
const BOB_SAFETY = env('BOB_SAFETY');
const CAROL_NAME = env('CAROL_NAME');
const MALLORY_ADDRESS = env('MALLORY_ADDRESS');

/** Dispatches a real paste event with `text` on the page body (paste anywhere). */
async function pasteAnywhere(page, text) {
  await page.evaluate((t) => {
    const dt = new DataTransfer();
    dt.setData('text/plain', t);
    document.body.dispatchEvent(new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true }));
  }, text);
}

// ----- the scenario ---------------------------------------------------------------------------

await scenario(async ({ browser, page }) => {
  step('first run');
  await page.goto(UI_URL);
  await page.getByRole('heading', { name: 'Welcome to Switchboard' }).waitFor();
  assert(!page.url().includes('code='), 'the sign-in code is erased from the address bar');
  await page.getByLabel('Your name, as contacts see it').fill('Alice');
  await page.getByLabel('Use a relay at this URL').check();
  // A relay that does not answer: first run says so and makes no identity.
  await page.getByLabel('Relay URL').fill('http://127.0.0.1:9');
  await page.getByRole('button', { name: 'Create identity' }).click();
  const down = page.getByRole('alert').filter({ hasText: 'could not reach the relay' });
  await down.waitFor();
  assert((await down.textContent()).includes('http://127.0.0.1:9 did not answer'), `what failed: ${await down.textContent()}`);
  await shot(page, '01a-first-run-relay-down');
  assert((await page.getByRole('heading', { name: 'Welcome to Switchboard' }).count()) === 1, 'still on first run');
  await page.getByLabel('Relay URL').fill(RELAY_URL);
  await shot(page, '01-first-run');
  await page.getByRole('button', { name: 'Create identity' }).click();
  await page.getByRole('heading', { name: 'Your identity is ready' }).waitFor();
  assert(!page.url().includes('code='), 'the second sign-in code is erased too');
  const card = page.locator('.identity[data-protocol="letagents"]');
  const aliceAddress = (await card.locator('code.address').textContent()).trim();
  const aliceSafety = (await card.locator('.safety').textContent()).trim();
  assert(/^la1\.[A-Za-z0-9_-]{43}\.[A-Za-z0-9_-]{43}\.[A-Za-z0-9_-]{22}$/.test(aliceAddress), `address ${aliceAddress}`);
  assert(/^([A-Z2-7]{4} ){7}[A-Z2-7]{4}$/.test(aliceSafety), `safety number ${aliceSafety}`);
  await card.getByRole('img', { name: 'QR code of your letagents address' }).waitFor();
  const qrOk = await card.locator('img.qr').evaluate((img) => img.complete && img.naturalWidth > 0);
  assert(qrOk, 'the address QR code renders');
  const qrText = await readQr(card.locator('img.qr'));
  assert(qrText === aliceAddress, `the QR code holds the address: ${qrText}`);
  await shot(page, '02-identity-ready');
  await page.getByRole('button', { name: 'Continue' }).click();
  await page.getByRole('navigation', { name: 'Main' }).waitFor();

  step('add a contact by pasting its address anywhere');
  await page.getByRole('heading', { name: 'Chats', exact: true }).waitFor();
  await pasteAnywhere(page, BOB_ADDRESS);
  const dialog = page.getByRole('dialog', { name: 'Add this contact?' });
  await dialog.waitFor();
  await dialog.getByText('letagents address', { exact: true }).waitFor();
  await page.waitForFunction(
    (n) => document.getElementById('preview-fingerprint')?.textContent === n,
    BOB_SAFETY,
  );
  await shot(page, '03-paste-preview');
  await dialog.getByLabel('Name for this contact').fill('bob');
  await dialog.getByRole('button', { name: 'Add contact' }).click();
  await page.getByRole('link', { name: 'Open conversation with bob' }).waitFor();

  step('exchange messages with a second profile');
  await driver({ op: 'bob_accept', from: aliceAddress });
  await page.getByRole('link', { name: 'Open conversation with bob' }).click();
  await page.getByLabel('Message', { exact: true }).fill('hello bob, from the browser');
  await page.getByRole('button', { name: 'Send' }).click();
  const got = await driver({ op: 'bob_wait_for', text: 'hello bob, from the browser' });
  assert(got.from, 'bob received the message');
  await page.locator('.msg.out[data-state="delivered"]').first().waitFor({ timeout: 30_000 });
  const delivered = page.locator('.msg.out[data-state="delivered"] .tick-delivered').first();
  assert((await delivered.textContent()) === 'Delivered', 'a delivered message says so to a screen reader');
  assert((await delivered.locator('svg path').count()) === 2, 'delivered shows two ticks');
  await driver({ op: 'bob_send', text: 'hi alice, bob here', kind: 'ask' });
  const incoming = page.locator('.msg.in', { hasText: 'hi alice, bob here' });
  await incoming.waitFor({ timeout: 30_000 });
  step('reply in a thread');
  await incoming.getByRole('button', { name: /^Reply/ }).click();
  await page.getByLabel('Message', { exact: true }).fill('answering your question');
  await page.getByRole('button', { name: 'Send' }).click();
  const reply = await driver({ op: 'bob_wait_for', text: 'answering your question' });
  assert(reply.kind === 'reply' && reply.reply_to, `bob got a reply in the thread: ${JSON.stringify(reply)}`);
  await page.locator('.msg.out blockquote.parent', { hasText: 'hi alice, bob here' }).waitFor();
  step('the conversation is a chat: newest at the bottom, composer pinned, day separator, short times');
  await page.getByText('Enter to send · Shift+Enter for a new line · Alt+Shift+↓ next unread').waitFor();
  assert((await page.locator('.messages .day').first().textContent()) === 'Today', 'a day separator');
  const times = await page.locator('.msg .meta time').allTextContents();
  assert(times.length > 0 && times.every((t) => /^\d{1,2}:\d\d(\s?[AP]M)?$/.test(t)), `short times: ${times}`);
  assert(await inViewport(page.locator('form.compose')), 'the composer is on screen');
  const scrolledToNewest = await page.locator('#message-scroll').evaluate((e) => e.scrollHeight - e.scrollTop - e.clientHeight < 2);
  assert(scrolledToNewest, 'the conversation shows its newest message');
  const tabStops = await page.locator('#message-scroll').evaluate(
    (e) => [...e.querySelectorAll('a[href], button, input, textarea, select, [tabindex]')].filter((x) => x.tabIndex >= 0).length,
  );
  assert(tabStops === 0, `no tab stop per message (the list itself is one): ${tabStops}`);
  await page.getByRole('button', { name: 'Details' }).click();
  const panel = page.getByRole('complementary', { name: 'About bob' });
  await panel.getByLabel('My messages are').waitFor();
  await panel.getByRole('group', { name: 'They may send me' }).waitFor();
  await shot(page, '04-conversation');
  await panel.getByRole('button', { name: 'Close' }).click();
  await panel.waitFor({ state: 'hidden' });

  step('unread: a message that arrives while another screen is open is counted');
  await nav(page, 'Settings').click();
  await page.getByRole('heading', { name: 'Settings', exact: true }).waitFor();
  assert((await page.title()) === 'Switchboard', `no unread yet: ${await page.title()}`);
  await driver({ op: 'bob_send', text: 'are you there?', kind: 'send' });
  await driver({ op: 'bob_send', text: 'ping again', kind: 'send' });
  await nav(page, 'Chats (2 unread)').waitFor({ timeout: 30_000 });
  assert((await page.title()) === '(2) Switchboard', `the window title counts: ${await page.title()}`);
  await nav(page, 'Chats').click();
  const bobRow = page.locator('.chat[data-contact="bob"]');
  await bobRow.locator('.unread-count', { hasText: '2' }).waitFor();
  assert((await bobRow.locator('.chat-preview').textContent()) === 'ping again', 'the preview is the newest message');
  assert(/^\d{1,2}:\d\d(\s?[AP]M)?$/.test(await bobRow.locator('.chat-time').textContent()), 'a short time, no seconds');
  const weight = await bobRow.locator('.chat-preview').evaluate((e) => getComputedStyle(e).fontWeight);
  assert(Number(weight) >= 600, `an unread conversation is bold: ${weight}`);
  assert(
    (await page.locator('.chat[data-contact]').first().getAttribute('data-contact')) === 'bob',
    'the latest activity comes first',
  );
  await shot(page, '04a-unread');
  await page.getByRole('link', { name: /Open conversation with bob, 2 unread/ }).click();
  await page.locator('.msg.in', { hasText: 'ping again' }).waitFor();
  await page.waitForFunction(() => document.title === 'Switchboard');
  assert((await bobRow.locator('.unread-count').count()) === 0, 'opening the conversation reads it');
  assert((await nav(page, 'Chats').textContent()).trim() === 'Chats', 'no count in the navigation');

  step('shortcuts: Alt+Shift+Down opens the next chat with unread messages at its message box, Ctrl+M goes to the message box');
  await nav(page, 'Settings').click();
  await page.getByRole('heading', { name: 'Keyboard shortcuts' }).waitFor();
  await page.getByText('Next chat with unread messages').waitFor();
  await driver({ op: 'bob_send', text: 'one more thing', kind: 'send' });
  await nav(page, 'Chats (1 unread)').waitFor({ timeout: 30_000 });
  await page.keyboard.press('Alt+Shift+ArrowDown');
  await page.getByRole('heading', { name: 'Conversation with bob' }).waitFor();
  await page.locator('.msg.in', { hasText: 'one more thing' }).waitFor();
  await page.waitForFunction(() => document.activeElement?.id === 'compose');
  await page.waitForFunction(() => document.title === 'Switchboard');
  await page.locator('#message-scroll').focus();
  await page.keyboard.press('Control+m');
  await page.waitForFunction(() => document.activeElement?.id === 'compose');
  await page.keyboard.press('Alt+Shift+ArrowDown');
  await page.getByRole('status').filter({ hasText: 'No unread messages.' }).waitFor();

  step('keyboard only: the navigation, a contact, the composer, and the preview dialog');
  /** Presses Tab until `isHere` (run in the page) holds for the focused element. */
  const tabTo = async (what, isHere) => {
    for (let i = 0; i < 150; i++) {
      await page.keyboard.press('Tab');
      if (await page.evaluate(isHere)) return;
    }
    throw new Error(`Tab never reached ${what}`);
  };
  await page.evaluate(() => document.activeElement instanceof HTMLElement && document.activeElement.blur());
  await tabTo('the Chats link', () => document.activeElement?.closest('nav') && document.activeElement.textContent.startsWith('Chats'));
  await page.keyboard.press('Enter');
  await page.getByRole('heading', { name: 'Chats', exact: true }).waitFor();
  await tabTo("bob's conversation link", () => document.activeElement?.getAttribute('href') === '#/c/bob');
  await page.keyboard.press('Enter');
  // Tab only once the conversation has rendered: presses made while the list is replaced by the
  // conversation land on elements that are about to go.
  await page.getByRole('heading', { name: 'Conversation with bob' }).waitFor();
  await page.getByLabel('Message', { exact: true }).waitFor();
  await tabTo('the message field', () => document.activeElement?.id === 'compose');
  await page.keyboard.type('typed with the keyboard alone');
  await page.keyboard.press('Shift+Enter');
  await page.keyboard.type('on two lines');
  await page.keyboard.press('Enter');
  const typed = await driver({ op: 'bob_wait_for', text: 'typed with the keyboard alone\non two lines' });
  // Away and back before the screen changed, typing into it meanwhile (the race this step once
  // lost characters to in CI: a heading of the screen being left satisfied the wait): the
  // re-render of the same conversation keeps what was typed.
  const raced = await page.evaluate(async () => {
    const stale = document.getElementById('compose');
    stale.dataset.stale = 'yes';
    location.hash = '#/contacts';
    location.hash = '#/c/bob';
    await new Promise((r) => setTimeout(r, 0));
    // The new screen already on the page: the race did not happen this time.
    if (!stale.isConnected) return false;
    stale.focus();
    return true;
  });
  const renderedAgain = () =>
    page.waitForFunction(() => {
      const c = document.getElementById('compose');
      return c && !c.dataset.stale;
    });
  if (raced) {
    // Typed after the focus went back to the old composer; whether the new one lands before,
    // during or after these keystrokes, all of them must end up in it.
    await page.keyboard.type('kept across');
    await renderedAgain();
    const kept = await page.evaluate(() => document.getElementById('compose').value);
    assert(kept === 'kept across', `what was typed while the conversation was rendered again stays: ${JSON.stringify(kept)}`);
  } else {
    await renderedAgain();
    step('(the conversation was rendered again before the old composer could be reached: nothing to check)');
  }
  await page.getByLabel('Message', { exact: true }).fill('');
  assert(typed.from, 'bob received the message sent with Enter, Shift+Enter a new line in it');
  assert((await page.getByLabel('Message', { exact: true }).inputValue()) === '', 'the composer is empty after sending');
  await page.locator('.msg.out', { hasText: 'on two lines' }).waitFor();
  assert(
    await page.locator('#message-scroll').evaluate((e) => e.scrollHeight - e.scrollTop - e.clientHeight < 2),
    'the sent message is in view',
  );
  // The preview dialog takes the focus and Escape closes it, adding nothing.
  await page.evaluate(() => document.activeElement instanceof HTMLElement && document.activeElement.blur());
  await pasteAnywhere(page, MALLORY_ADDRESS);
  const kbDialog = page.getByRole('dialog', { name: 'Add this contact?' });
  await kbDialog.waitFor();
  assert(await kbDialog.evaluate((d) => d.contains(document.activeElement)), 'the dialog has the focus');
  await page.keyboard.press('Escape');
  await kbDialog.waitFor({ state: 'hidden' });

  step('a 480×400 window: one pane at a time, no sideways scrolling, the composer and newest message in view');
  await page.setViewportSize({ width: 480, height: 400 });
  await nav(page, 'Chats').click();
  await page.getByRole('link', { name: /Open conversation with bob/ }).waitFor();
  assert(!(await scrollsSideways(page)), 'the chat list does not scroll sideways at 480 px');
  await shot(page, '04b-small-chats');
  await page.getByRole('link', { name: /Open conversation with bob/ }).click();
  await page.getByRole('heading', { name: 'Conversation with bob' }).waitFor();
  assert(!(await scrollsSideways(page)), 'the conversation does not scroll sideways at 480 px');
  assert(await inViewport(page.getByLabel('Message', { exact: true })), 'the composer is in view at 480×400');
  assert(await inViewport(page.getByRole('button', { name: 'Send' })), 'the send button is in view at 480×400');
  const newest = page.locator('.msg').last();
  assert(await inViewport(newest), 'the newest message is in view at 480×400');
  assert(await inViewport(page.getByRole('link', { name: 'Back to chats' })), 'a way back to the list');
  const replyShown = () => page.locator('.msg.in .reply').first().evaluate((b) => getComputedStyle(b).opacity);
  await page.mouse.move(1, 1);
  assert((await replyShown()) === '0', 'no Reply button on every bubble in a narrow window');
  await page.locator('.msg.in').first().hover();
  assert((await replyShown()) === '1', 'Reply shows on the hovered bubble');
  await page.mouse.move(1, 1);
  await shot(page, '04c-small-conversation');
  await page.setViewportSize({ width: 1280, height: 800 });

  step('the relay goes down: a connection bar, and a queued message shows a clock, unlike a delivered one');
  await driver({ op: 'relay_stop' });
  const bar = page.locator('.connection').filter({ hasText: 'reach the relay' });
  await bar.waitFor({ timeout: 30_000 });
  assert((await bar.getAttribute('role')) === 'status', 'the bar is announced politely');
  await page.getByLabel('Message', { exact: true }).fill('sent while the relay is down');
  await page.keyboard.press('Enter');
  const queued = page.locator('.msg.out[data-state="queued"]', { hasText: 'sent while the relay is down' });
  await queued.waitFor();
  const qTick = queued.locator('.tick-queued');
  assert((await qTick.textContent()) === 'Queued: not sent yet', 'a queued message says so');
  assert((await qTick.locator('svg circle').count()) === 1, 'queued shows a clock');
  const dTick = page.locator('.msg.out[data-state="delivered"] .tick').first();
  const colour = (l) => l.evaluate((e) => getComputedStyle(e).color);
  assert((await colour(qTick)) !== (await colour(dTick)), 'queued and delivered differ in colour');
  await bar.filter({ hasText: '1 message waits' }).waitFor({ timeout: 10_000 });
  await shot(page, '04d-relay-down');
  await driver({ op: 'relay_restart' });
  await bar.waitFor({ state: 'hidden', timeout: 60_000 });
  await page
    .locator('.msg.out', { hasText: 'sent while the relay is down' })
    .and(page.locator('[data-state="relayed"], [data-state="delivered"]'))
    .waitFor({ timeout: 60_000 });
  await driver({ op: 'bob_wait_for', text: 'sent while the relay is down' });

  step('approve a hello request');
  await driver({ op: 'carol_hello', to: aliceAddress });
  await nav(page, 'Chats').click();
  const approve = page.getByRole('button', { name: `Approve ${CAROL_NAME}` });
  await approve.waitFor({ timeout: 30_000 });
  await shot(page, '05-request');
  const claimed = await page.getByLabel(`Name for ${CAROL_NAME}`).inputValue();
  assert(claimed === CAROL_NAME, `approving asks for a name, prefilled with the claimed one: ${claimed}`);
  await approve.click();
  await page.getByRole('link', { name: `Open conversation with ${CAROL_NAME}` }).waitFor();
  assert((await page.getByRole('button', { name: `Approve ${CAROL_NAME}` }).count()) === 0, 'request gone');

  step('a person added by contact link: with the relay down long enough, a message moves from letagents to Agent Mail and says so');
  const daveLink = await driver({ op: 'dave_link' });
  await pasteAnywhere(page, daveLink);
  const daveDialog = page.getByRole('dialog', { name: 'Add this contact?' });
  await daveDialog.waitFor();
  await daveDialog.getByLabel('Name for this contact').fill('dave');
  await daveDialog.getByRole('button', { name: 'Add contact' }).click();
  // The new conversation opens by itself, ready to type in.
  await page.getByRole('heading', { name: 'Conversation with dave' }).waitFor();
  await page.waitForFunction(() => document.activeElement?.id === 'compose');
  const channelsShown = await page.locator('.contact-panel .channel').evaluateAll((l) => l.map((e) => e.dataset.channel));
  assert(channelsShown.join() === 'letagents,agent-mail,stringcup', `dave's channels listed: ${channelsShown}`);
  await driver({ op: 'relay_stop' });
  await page.getByLabel('Message', { exact: true }).fill('moved when letagents was down');
  await page.keyboard.press('Enter');
  await page.locator('.msg.out[data-state="queued"]', { hasText: 'moved when letagents was down' }).waitFor();
  // As if the relay had been down for ten minutes: the outbox moves it to the next channel.
  await driver({ op: 'alice_age_outbox', text: 'moved when letagents was down' });
  const moved = page.locator('.msg.out', { hasText: 'moved when letagents was down' });
  await moved.locator('.badge.moved', { hasText: 'moved from letagents' }).waitFor({ timeout: 30_000 });
  await moved.locator('.badge.channel', { hasText: 'via Agent Mail' }).waitFor();
  assert((await moved.count()) === 1, 'the message shows once, on the channel that carries it');
  await driver({ op: 'relay_restart' });
  const daveGot = await driver({ op: 'dave_wait_for', text: 'moved when letagents was down' });
  assert(daveGot.protocol === 'agent-mail', `dave got it over Agent Mail: ${JSON.stringify(daveGot)}`);
  await page.locator('.contact-panel .channel[data-channel="letagents"][data-reachable="false"]').waitFor({ state: 'attached' });
  await shot(page, '05b-moved-from-letagents');

  step('verify a safety number');
  await page.getByRole('link', { name: 'Open conversation with bob' }).click();
  // The Verify link is bob's only once his conversation replaced dave's.
  await page.getByRole('heading', { name: 'Conversation with bob' }).waitFor();
  await page.getByRole('link', { name: 'Verify' }).click();
  await page.getByRole('heading', { name: 'Verify bob' }).waitFor();
  const mine = (await page.locator('.safety[data-who="me"]').textContent()).trim();
  const theirs = (await page.locator('.safety[data-who="them"]').textContent()).trim();
  assert(mine === aliceSafety, `my safety number shown: ${mine}`);
  assert(theirs === BOB_SAFETY, `bob's safety number shown: ${theirs}`);
  assert((await page.locator('.verify img.qr').count()) === 2, 'both numbers as QR codes');
  const qrs = await Promise.all([0, 1].map((i) => readQr(page.locator('.verify img.qr').nth(i))));
  assert(qrs.includes(aliceSafety) && qrs.includes(BOB_SAFETY), `the QR codes hold both numbers: ${qrs}`);
  await shot(page, '06-verify');
  await page.getByRole('button', { name: 'Mark verified' }).click();
  await page.getByRole('heading', { name: 'Conversation with bob' }).waitFor();
  await page.locator('.conversation .conv-head .badge.ok', { hasText: 'Verified' }).waitFor();
  step('a notice goes away by itself after a few seconds');
  const verifiedNotice = page.getByRole('status').filter({ hasText: 'Verified.' });
  await verifiedNotice.waitFor();
  const shownAt = Date.now();
  await verifiedNotice.waitFor({ state: 'hidden', timeout: 10_000 });
  assert(Date.now() - shownAt < 8_000, 'the notice cleared within a few seconds');

  step('the contact panel says what the protocol proves about the sender, and blocks and unblocks');
  await page.getByRole('button', { name: 'Details' }).click();
  const blockPanel = page.locator('#contact-panel');
  await blockPanel.waitFor();
  const senderLabel = (await blockPanel.locator('.sender-auth').textContent()).trim();
  assert(senderLabel.startsWith('Sender signed end to end'), `letagents sender label: ${senderLabel}`);
  // `exact`: "Unblock bob" contains "Block bob".
  await page.getByRole('button', { name: 'Block bob', exact: true }).click();
  await page.locator('.conversation .conv-head .badge.danger', { hasText: 'Blocked' }).waitFor();
  assert((await page.locator('.banner', { hasText: 'You blocked this contact' }).count()) === 1, 'a blocked banner');
  assert(await page.getByRole('button', { name: 'Send' }).isDisabled(), 'no sending to a blocked contact');
  await page.getByRole('button', { name: 'Unblock bob', exact: true }).click();
  await page.getByRole('button', { name: 'Block bob', exact: true }).waitFor();
  await page.locator('.conversation .conv-head .badge', { hasText: 'Blocked' }).waitFor({ state: 'detached' });
  assert(!(await page.getByRole('button', { name: 'Send' }).isDisabled()), 'sending allowed again');
  await blockPanel.getByRole('button', { name: 'Close' }).click();

  step('pasting garbage says so, in plain words, and the notice clears on navigation');
  await page.evaluate(() => document.activeElement instanceof HTMLElement && document.activeElement.blur());
  await pasteAnywhere(page, 'just some words, not an address');
  const garbage = page.getByRole('alert').filter({ hasText: 'Nothing to add' });
  await garbage.waitFor();
  await shot(page, '06a-paste-garbage');
  await nav(page, 'Chats').click();
  await garbage.waitFor({ state: 'hidden', timeout: 2_000 });

  step('a runtime error in plain words, without its code');
  await page.getByLabel('Address to add').fill(aliceAddress);
  await page.getByRole('button', { name: 'Preview' }).click();
  await dialog.getByLabel('Name for this contact').fill('myself');
  await dialog.getByRole('button', { name: 'Add contact' }).click();
  const ownErr = dialog.getByRole('alert');
  await ownErr.waitFor();
  const ownText = (await ownErr.textContent()).trim();
  assert(/^That is our own address\.?$/i.test(ownText) && !ownText.includes('invalid_input'), `plain words: ${ownText}`);
  await dialog.getByRole('button', { name: 'Cancel' }).click();

  step('a key change shows a banner and blocks sending');
  await nav(page, 'Chats').click();
  await page.getByLabel('Address to add').fill(MALLORY_ADDRESS);
  await page.getByRole('button', { name: 'Preview' }).click();
  await dialog.waitFor();
  await dialog.getByLabel('Name for this contact').fill('mallory');
  await dialog.getByRole('button', { name: 'Add contact' }).click();
  await page.getByRole('link', { name: 'Open conversation with mallory' }).click();
  await page.getByRole('heading', { name: /Conversation with mallory/ }).waitFor();
  await driver({ op: 'mallory_rekey', to: aliceAddress });
  const banner = page.getByRole('alert').filter({ hasText: 'key changed' });
  await banner.waitFor({ timeout: 30_000 });
  assert(await page.getByRole('button', { name: 'Send' }).isDisabled(), 'send button disabled');
  assert(await page.getByLabel('Message', { exact: true }).isDisabled(), 'compose disabled');
  // The runtime refuses too, not just the button.
  const refused = await page.evaluate(async () => {
    const r = await fetch('/v1/rpc', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ op: 'send', contact: 'mallory', text: 'sneaky' }),
    });
    return { status: r.status, body: await r.json() };
  });
  assert(refused.status === 409 && refused.body.code === 'key_changed', `runtime refuses: ${JSON.stringify(refused)}`);
  await shot(page, '07-key-changed');
  await banner.getByRole('link', { name: 'Compare and re-verify' }).click();
  await page.getByRole('heading', { name: 'Verify mallory' }).waitFor();
  const newNumber = (await page.locator('.safety[data-who="them"]').textContent()).trim();
  const expected = await driver({ op: 'mallory_new_safety' });
  assert(newNumber === expected, `new safety number shown: ${newNumber}`);
  await page.getByRole('button', { name: 'Mark verified' }).click();
  await page.getByRole('heading', { name: 'Conversation with mallory' }).waitFor();
  assert((await page.getByRole('alert').filter({ hasText: 'key changed' }).count()) === 0, 'banner gone');
  assert(!(await page.getByRole('button', { name: 'Send' }).isDisabled()), 'sending allowed again');

  step('groups: a new group with an invite link counting down, members with fingerprints');
  const link = await newGroupInvite(page);
  assert(/^https?:\/\/[^/]+\/i\/[A-Za-z0-9_-]+#.+/.test(link), `invite link ${link}`);
  await page.getByRole('cell', { name: 'Alice (you)' }).waitFor();
  await shot(page, '08-groups');

  step('activity log search');
  await nav(page, 'Activity').click();
  await page.locator('table.log tbody tr').first().waitFor();
  // A person's channels (dave came by contact link) show under the person's name, never an id.
  await page.getByRole('cell', { name: 'dave', exact: true }).first().waitFor();
  const peers = await page.locator('table.log tbody tr td:nth-child(4)').allTextContents();
  assert(peers.every((p) => !/^[A-Za-z0-9_-]{12}$/.test(p.trim())), `no raw ids for contacts: ${peers.slice(0, 8)}`);
  const when = await page.locator('table.log tbody time').evaluateAll((l) => l.map((t) => Date.parse(t.getAttribute('datetime'))));
  // (Rows are in the order they were written; a row's clock may trail its neighbour's by a few ms.)
  assert(when.length > 10 && when[0] - when[when.length - 1] > 1000, `the newest activity comes first: ${when[0]} … ${when.at(-1)}`);
  // A long page scrolls under the navigation, which stays in view.
  await page.evaluate(() => window.scrollTo(0, document.body.scrollHeight));
  assert(await page.evaluate(() => scrollY > 0), 'the log is long enough to scroll');
  assert(await inViewport(nav(page, 'Chats')), 'the navigation stays in view on a scrolled page');
  await page.evaluate(() => window.scrollTo(0, 0));
  await shot(page, '09-log');
  await page.getByLabel('Search the log').fill('no-such-activity-anywhere');
  await page.getByText('No activity matches.').waitFor();
  await page.getByLabel('Search the log').fill('');
  await page.locator('table.log tbody tr').first().waitFor();

  step('Ctrl+F from another screen searches the message text');
  await page.keyboard.press('Control+f');
  const search = page.getByLabel('Search messages');
  await search.waitFor();
  await page.waitForFunction(() => document.activeElement?.id === 'msg-search');
  await page.keyboard.type('PING');
  const hit = page.getByRole('list', { name: 'Messages found' }).getByRole('link').filter({ hasText: 'ping again' });
  await hit.waitFor();
  assert((await hit.locator('mark').textContent()) === 'ping', 'the match is marked');
  await page.getByText('Searched on this device', { exact: false }).waitFor();
  await shot(page, '09a-search');
  await hit.click();
  await page.locator('.msg.found', { hasText: 'ping again' }).waitFor();
  assert(await inViewport(page.locator('.msg.found')), 'the message found is scrolled into view');
  await search.focus();
  await page.keyboard.press('Escape');
  await page.getByRole('list', { name: 'Chats' }).waitFor();

  step('dark mode follows the system, and Settings can override it');
  const bg = () => page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor);
  const light = await bg();
  await page.emulateMedia({ colorScheme: 'dark' });
  await page.waitForFunction((l) => getComputedStyle(document.documentElement).backgroundColor !== l, light);
  const dark = await bg();
  assert(dark === 'rgb(17, 19, 24)', `the dark background: ${dark}`);
  await shot(page, '09b-dark-conversation');
  await nav(page, 'Settings').click();
  await page.getByLabel('Theme').selectOption('light');
  assert((await bg()) === light, 'the setting overrides the system');
  await page.reload();
  await page.getByLabel('Theme').waitFor();
  assert((await bg()) === light && (await page.getByLabel('Theme').inputValue()) === 'light', 'the choice is kept');
  await page.getByLabel('Theme').selectOption('system');
  assert((await bg()) === dark, 'back to following the system');
  await page.emulateMedia({ colorScheme: 'light' });
  await page.getByLabel('Theme').selectOption('dark');
  assert((await bg()) === dark, 'dark chosen in a light system');
  await page.getByLabel('Theme').selectOption('system');

  step("review mode from Settings: an agent's message is held, counted in a badge, readable, approved");
  await nav(page, 'Settings').click();
  await page.getByLabel('Hold messages my agents write until I approve them').check();
  await page.getByRole('status').filter({ hasText: 'Review mode is on.' }).waitFor();
  const policy = await page.evaluate(async () => {
    const r = await fetch('/v1/rpc', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"op":"policy"}' });
    return r.json();
  });
  assert(policy.review === 'review', `the runtime's policy changed: ${JSON.stringify(policy)}`);
  const held = await driver({ op: 'alice_agent_send', agent: 'coder', to: 'bob', text: 'may I share the plan?' });
  assert(JSON.stringify(held).includes('held'), `the agent's message is held: ${JSON.stringify(held)}`);
  await nav(page, 'Review (1 waiting)').waitFor({ timeout: 30_000 });
  await nav(page, 'Review').click();
  const item = page.getByRole('listitem', { name: /coder → bob/ });
  await item.waitFor();
  assert(/^coder → bob, (just now|\d+ seconds? ago|1 minute ago)$/.test((await item.locator('.review-head').textContent()).trim()), `readable: ${await item.locator('.review-head').textContent()}`);
  const itemText = await item.textContent();
  assert(!/\d{12,}/.test(itemText) && !itemText.includes('created_at'), `no raw timestamps or field names: ${itemText}`);
  await item.getByText('may I share the plan?').waitFor();
  await shot(page, '11a-review-item');
  await item.getByRole('button', { name: /^Approve and send/ }).click();
  await page.getByRole('status').filter({ hasText: 'Approved: sent to bob.' }).waitFor();
  await page.getByText('Nothing is waiting for review.').waitFor();
  assert((await nav(page, 'Review').textContent()).trim() === 'Review', 'the badge is gone');
  await driver({ op: 'bob_wait_for', text: 'may I share the plan?' });
  // For a person (several channels), the item names the person, not the channel it goes on.
  await driver({ op: 'alice_agent_send', agent: 'coder', to: 'dave', text: 'dave, a question for later' });
  await nav(page, 'Review (1 waiting)').waitFor({ timeout: 30_000 });
  await nav(page, 'Review').click();
  const daveItem = page.getByRole('listitem', { name: /coder → dave,/ });
  await daveItem.waitFor();
  assert(!(await daveItem.textContent()).includes('dave.'), `the person's name, not a channel: ${await daveItem.textContent()}`);
  await daveItem.getByRole('button', { name: /^Reject/ }).click();
  await page.getByText('Nothing is waiting for review.').waitFor();
  await nav(page, 'Settings').click();
  await page.getByLabel('Hold messages my agents write until I approve them').uncheck();
  await page.getByRole('status').filter({ hasText: 'Review mode is off.' }).waitFor();

  step('review mode for one contact (Settings off), and a held message edited before it is approved');
  await nav(page, 'Chats').click();
  await page.getByRole('link', { name: /Open conversation with bob/ }).click();
  await page.getByRole('heading', { name: 'Conversation with bob' }).waitFor();
  await page.getByRole('button', { name: 'Details' }).click();
  const outbound = page.getByRole('complementary', { name: 'About bob' }).getByLabel('Messages my agents write to this contact');
  assert((await outbound.inputValue()) === 'default', 'a contact follows Settings until told otherwise');
  await outbound.selectOption('review');
  await page.getByRole('status').filter({ hasText: 'Messages your agents write to bob now wait for your review.' }).waitFor();
  const perContact = await page.evaluate(async () => {
    const r = await fetch('/v1/rpc', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"op":"contact_review","name":"bob"}' });
    return r.json();
  });
  assert(perContact.outbound === 'review', `the runtime holds bob's agent messages: ${JSON.stringify(perContact)}`);
  const held2 = await driver({ op: 'alice_agent_send', agent: 'coder', to: 'bob', text: 'the plan is attached, ship it' });
  assert(JSON.stringify(held2).includes('held'), `held for bob alone: ${JSON.stringify(held2)}`);
  await nav(page, 'Review (1 waiting)').click();
  const item2 = page.getByRole('listitem', { name: /coder → bob/ });
  await item2.getByRole('button', { name: /^Edit/ }).click();
  const editBox = item2.getByLabel('Text to send');
  await page.waitForFunction(() => document.activeElement?.id?.startsWith('review-edit-'));
  assert((await editBox.inputValue()) === 'the plan is attached, ship it', 'the edit starts from what the agent wrote');
  await editBox.fill('the plan is attached; please review before shipping');
  await shot(page, '11b-review-edit');
  await item2.getByRole('button', { name: /^Send as edited/ }).click();
  await page.getByRole('status').filter({ hasText: 'Approved with your changes: sent to bob.' }).waitFor();
  const edited = await driver({ op: 'bob_wait_for', text: 'the plan is attached; please review before shipping' });
  assert(edited.from, 'bob got the edited text');
  await nav(page, 'Chats').click();
  await page.getByRole('link', { name: /Open conversation with bob/ }).click();
  await page.getByRole('heading', { name: 'Conversation with bob' }).waitFor();
  await page.locator('.msg.out', { hasText: 'please review before shipping' }).waitFor();
  assert((await page.locator('.msg', { hasText: 'ship it' }).count()) === 0, "the agent's unedited text was never sent");
  // The details panel stays open from before (it is one switch for every conversation).
  await page.getByRole('complementary', { name: 'About bob' }).waitFor();
  await page.getByLabel('Messages my agents write to this contact').selectOption('default');
  await page.getByRole('status').filter({ hasText: 'follow Settings' }).waitFor();

  step("a message to one of my agents says so, and whether the agent has it yet");
  await driver({ op: 'bob_send_to_agent', agent: 'coder', text: 'coder, please run the tests' });
  const forAgent = page.locator('.msg.in.to-agent', { hasText: 'coder, please run the tests' });
  await forAgent.waitFor({ timeout: 30_000 });
  await forAgent.getByText('for your agent coder').waitFor();
  await forAgent.getByText('waiting for coder').waitFor();
  // A notice above the pane shrank it while it was at its newest message: it stays there.
  assert(await inViewport(forAgent), 'the newest message is in view (a notice shrinking the pane is not scrolling up)');
  await shot(page, '11c-for-agent-waiting');
  const handed = await driver({ op: 'alice_agent', agent: 'coder', body: { op: 'wait', timeout_secs: 10 } });
  assert(JSON.stringify(handed).includes('coder, please run the tests'), `the agent was handed it: ${JSON.stringify(handed)}`);
  await forAgent.locator('[data-handout="handed"]', { hasText: 'handed to coder' }).waitFor({ timeout: 30_000 });
  await driver({ op: 'alice_agent', agent: 'coder', body: { op: 'ack', lease: handed.lease } });
  await forAgent.locator('[data-handout="delivered"]', { hasText: 'handed to coder · read' }).waitFor({ timeout: 30_000 });
  await shot(page, '11d-for-agent-handed');

  step('the agent network: set up from Settings, then the account screen says how reading the mailbox went');
  await nav(page, 'Settings').click();
  await page.getByRole('link', { name: 'Open the agent network' }).click();
  await page.getByRole('heading', { name: 'Set up your account' }).waitFor();
  await shot(page, '13b-network-setup');
  await page.getByLabel('Service address').fill('network@example.test');
  await page.getByLabel('Your mailbox').fill('alice@example.test');
  await page.getByLabel('Password').fill('a password');
  await page.getByLabel('Sending server (SMTP)').fill('127.0.0.1:9');
  await page.getByLabel('Sending security').selectOption('none');
  await page.getByLabel('Reading server (IMAP)').fill('127.0.0.1:9');
  await page.getByLabel('Reading security').selectOption('none');
  await page.getByRole('button', { name: 'Save account' }).click();
  await page.getByText('alice@example.test on network@example.test.').waitFor();
  // Nothing listens on port 9: the screen says reading failed, in words, and stays usable.
  await page.getByRole('alert').filter({ hasText: 'Reading the mailbox failed' }).waitFor();
  await page.getByText('Not registered yet.').waitFor();
  await page.getByRole('button', { name: 'Ask to connect' }).waitFor();
  await shot(page, '13c-network');

  step('the other screens pass the accessibility audit too');
  for (const [link, heading, name] of [
    ['Agents', 'Local agents', '10-agents'],
    ['Review', 'Review queue', '11-review'],
    ['Settings', 'Settings', '12-settings'],
    ['My addresses', 'My addresses', '13-my-addresses'],
  ]) {
    await nav(page, link).click();
    await page.getByRole('heading', { name: heading, exact: true }).waitFor();
    await shot(page, name);
  }

  step('every main screen in light and dark, at 1280×800 and 480×400: audited, no sideways scrolling');
  const screens = [
    ['chats', '#/contacts', () => page.getByRole('heading', { name: 'Chats', exact: true })],
    ['conversation', '#/c/bob', () => page.getByRole('heading', { name: 'Conversation with bob' })],
    ['groups', '#/groups', () => page.getByRole('heading', { name: 'Groups', exact: true })],
    ['review', '#/review', () => page.getByRole('heading', { name: 'Review queue' })],
    ['activity', '#/log', () => page.getByRole('heading', { name: 'Activity log' })],
    ['settings', '#/settings', () => page.getByRole('heading', { name: 'Settings', exact: true })],
    ['addresses', '#/me', () => page.getByRole('heading', { name: 'My addresses' })],
    ['agents', '#/agents', () => page.getByRole('heading', { name: 'Local agents' })],
    ['network', '#/network', () => page.getByRole('heading', { name: 'Agent network' })],
  ];
  for (const [w, hgt] of [[1280, 800], [480, 400]]) {
    await page.setViewportSize({ width: w, height: hgt });
    for (const scheme of ['light', 'dark']) {
      await page.emulateMedia({ colorScheme: scheme });
      for (const [name, hash, heading] of screens) {
        await page.evaluate((x) => (location.hash = x), hash);
        await heading().waitFor();
        await page.waitForTimeout(100);
        if (w === 480) assert(!(await scrollsSideways(page)), `${name} does not scroll sideways at 480 px (${scheme})`);
        await shot(page, `20-${name}-${w}x${hgt}-${scheme}`);
      }
    }
  }
  await page.emulateMedia({ colorScheme: 'light' });
  await page.setViewportSize({ width: 1280, height: 800 });

  step('a browser without the cookie, or from another origin, is refused');
  const other = await browser.newContext();
  const stranger = await other.newPage();
  const base = new URL(page.url()).origin;
  await stranger.goto(base + '/');
  const anon = await stranger.evaluate(async () => (await fetch('/v1/rpc', { method: 'POST', body: '{"op":"whoami"}', headers: { 'content-type': 'application/json' } })).status);
  assert(anon === 401 || anon === 403, `no cookie: ${anon}`);
  const reused = await stranger.evaluate(async (u) => {
    const code = /code=([^&]+)/.exec(u)?.[1];
    const r = await fetch('/v1/session', { method: 'POST', body: JSON.stringify({ code }), headers: { 'content-type': 'application/json' } });
    return r.status;
  }, UI_URL);
  assert(reused === 401, `a used code is refused: ${reused}`);
  await other.close();

});
