// End-to-end: groups as conversations, in headless Chromium against the UI served by a real
// `switchboard ui` runtime (alice, with carol as a contact). Driven by tests/tests/ui_group_chat_e2e.rs,
// which plays bob (another profile on the same relay-lite): a line `REQ <json>` on stdout gets one
// line `RES <json>` on stdin.
//
// Environment: UI_URL (the single-use sign-in link), SHOT_DIR (screenshots), CHROMIUM.

import { assert, driver, env, inViewport, nav, scenario, scrollsSideways, shot, step } from './harness.mjs';

const UI_URL = env('UI_URL');

/** Dispatches a real paste event with `text` on the page body (paste anywhere). */
async function pasteAnywhere(page, text) {
  await page.evaluate((t) => {
    const dt = new DataTransfer();
    dt.setData('text/plain', t);
    document.body.dispatchEvent(new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true }));
  }, text);
}

/** The names of the chat list's rows, top to bottom. */
async function listOrder(page) {
  return page.locator('.chat-list .chats-ul > li .chat-name').allTextContents();
}

await scenario(async ({ page }) => {
  step('the Groups screen with no group: a plain empty state, no error');
  await page.goto(UI_URL);
  await nav(page, 'Groups').click();
  await page.getByRole('heading', { name: 'Groups', exact: true }).waitFor();
  await page.getByText('No groups yet. Create one above, or paste an invite link').waitFor();
  assert((await page.getByRole('alert').count()) === 0, 'no error on the empty Groups screen');
  const body = await page.locator('main').textContent();
  assert(!/session|listen|--handle/i.test(body), `no session or command talk: ${body}`);
  await shot(page, '01-groups-empty');

  step('a new group by name opens as a chat with its invite link counting down');
  await page.getByLabel('Group name').fill('Weekend trip');
  await page.getByRole('button', { name: 'Create group' }).click();
  await page.getByRole('heading', { name: 'Group: Weekend trip' }).waitFor();
  const invite = page.getByRole('region', { name: 'Invite link' });
  await invite.getByText(/expires in \d+:\d\d/).waitFor();
  const link = (await invite.locator('code').textContent()).trim();
  assert(/#[A-Za-z0-9_-]+&from=Alice&group=Weekend%20trip$/.test(link), `the link names inviter and group: ${link}`);
  await page.getByRole('cell', { name: 'Alice (you)' }).waitFor();
  await shot(page, '02-group-created');

  step('bob joins with the link: the single-use link shows as used, no countdown');
  const group = await driver({ op: 'bob_join', link });
  await invite.getByText('Used: Bob joined with this link.').waitFor({ timeout: 15_000 });
  assert((await invite.getByText(/expires in/).count()) === 0, 'a used link does not count down');
  await page.getByRole('cell', { name: 'Bob', exact: true }).waitFor();
  const bobFp = await driver({ op: 'bob_fingerprint' });
  await page.getByRole('cell', { name: bobFp }).waitFor();
  assert((await page.getByText('2 members').count()) > 0, 'the header counts the members');
  await shot(page, '03-invite-used');

  step('bob writes while alice looks at her chats: the group rises above carol with preview, time and count');
  await nav(page, 'Chats').click();
  await page.getByRole('link', { name: /^Open group Weekend trip/ }).waitFor();
  await driver({ op: 'bob_say', group, text: 'Who brings the tent?' });
  const row = page.locator('li[data-group]');
  await row.locator('.unread-count').getByText('1', { exact: true }).waitFor({ timeout: 15_000 });
  assert((await row.locator('.chat-preview').textContent()) === 'Bob: Who brings the tent?', 'the preview names the sender');
  assert((await row.locator('time').count()) === 1, 'the row shows a time');
  const order = await listOrder(page);
  assert(order[0] === 'Weekend trip' && order.includes('carol'), `latest activity first, groups among contacts: ${order}`);
  assert(/^\(1\) /.test(await page.title()), `the window title counts the unread group message: ${await page.title()}`);
  assert(!(await page.locator('main').textContent()).includes(group), 'no group id anywhere');
  await shot(page, '04-chats-group-unread');

  step('the group opens in the chat view: the message under its sender, read; alice answers with Enter');
  await page.getByRole('link', { name: /^Open group Weekend trip/ }).click();
  const log = page.getByRole('log', { name: 'Messages in Weekend trip' });
  await log.getByText('Who brings the tent?').waitFor();
  assert((await log.locator('li.msg.in .sender').first().textContent()) === 'Bob', 'the sender heads the message');
  await page.waitForFunction(() => !document.querySelector('li[data-group] .unread-count'));
  const compose = page.getByLabel('Message to Weekend trip');
  await compose.fill('I will bring it');
  await compose.press('Enter');
  await log.locator('li.msg.out').getByText('I will bring it').waitFor();
  const got = await driver({ op: 'bob_wait_for', group, text: 'I will bring it' });
  assert(got.from.name === 'Alice', `bob got it from Alice: ${JSON.stringify(got)}`);

  step('@mentions: "@Bob" addresses bob (the protocol carries him as the addressee); one to alice stands out');
  await page.getByText('@name addresses a member').waitFor();
  await compose.fill('@Bob can you bring the stove?');
  await compose.press('Enter');
  const mine = log.locator('li.msg.out', { hasText: 'can you bring the stove?' });
  await mine.locator('.mention-chip', { hasText: '@Bob' }).waitFor();
  // bobFp: bob's fingerprint, read from his runtime above.
  const addressed = await driver({ op: 'bob_wait_for', group, text: '@Bob can you bring the stove?' });
  assert(addressed.to === bobFp, `the message is addressed to bob: ${JSON.stringify(addressed)} (bob ${bobFp})`);
  const aliceFp = await page.evaluate(async (g) => {
    const r = await fetch('/v1/rpc', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ op: 'group_members', group: g }) });
    return (await r.json()).members.find((m) => m.you).fingerprint;
  }, group);
  await driver({ op: 'bob_say', group, text: 'Alice, do you have the map?', to: aliceFp });
  const toMe = log.locator('li.msg.in.mention', { hasText: 'do you have the map?' });
  await toMe.locator('.mention-chip.to-me', { hasText: '@you' }).waitFor({ timeout: 15_000 });
  assert((await log.locator('li.msg.in.mention').count()) === 1, 'only the message addressed to alice stands out');

  await page.getByRole('button', { name: 'Details' }).click();
  await page.getByRole('complementary', { name: 'Group details' }).waitFor({ state: 'hidden' });
  await shot(page, '05-group-chat');
  await page.emulateMedia({ colorScheme: 'dark' });
  await shot(page, '06-group-chat-dark');
  await page.emulateMedia({ colorScheme: 'light' });

  step('a small window: the newest message and the composer in view, no sideways scrolling');
  await page.setViewportSize({ width: 480, height: 400 });
  assert(await inViewport(compose), 'the composer is visible at 480×400');
  assert(await inViewport(log.getByText('I will bring it')), 'the newest message is visible at 480×400');
  assert(!(await scrollsSideways(page)), 'no horizontal scrolling at 480 px');
  await shot(page, '07-group-chat-480');
  await page.setViewportSize({ width: 1280, height: 800 });

  step('rename: the chat and the list follow');
  await page.getByRole('button', { name: 'Details' }).click();
  const details = page.getByRole('complementary', { name: 'Group details' });
  await details.getByLabel('Group name').fill('Trip to the lake');
  await details.getByRole('button', { name: 'Rename' }).click();
  await page.getByRole('heading', { name: 'Group: Trip to the lake' }).waitFor();
  await page.getByRole('link', { name: /^Open group Trip to the lake/ }).waitFor();

  step('a pasted invite link asks "Join group?" with the inviter and the group, and joins');
  const bandLink = await driver({ op: 'bob_invite', name: 'Band practice' });
  await nav(page, 'Chats').click();
  await pasteAnywhere(page, bandLink);
  const dialog = page.getByRole('dialog', { name: 'Join group?' });
  await dialog.waitFor();
  await dialog.getByText('Bob invited you to \u201cBand practice\u201d.').waitFor();
  const words = await dialog.textContent();
  assert(!/Add this contact|Safety number/.test(words), `a join, not a contact: ${words}`);
  await shot(page, '08-join-dialog');
  await dialog.getByRole('button', { name: 'Join group' }).click();
  await page.getByRole('heading', { name: 'Group: Band practice' }).waitFor({ timeout: 30_000 });
  await page.getByText('You joined \u201cBand practice\u201d.').waitFor();
  await driver({ op: 'bob_say', group: await driver({ op: 'bob_band' }), text: 'Welcome to the band' });
  await page.getByRole('log', { name: 'Messages in Band practice' }).getByText('Welcome to the band').waitFor({ timeout: 15_000 });
  await shot(page, '09-joined-from-link');

  step('a group nobody named is called by its members, never just "Bob" like a 1:1 chat');
  const unnamedLink = await driver({ op: 'bob_invite_unnamed' });
  await nav(page, 'Chats').click();
  await pasteAnywhere(page, unnamedLink);
  const joinUnnamed = page.getByRole('dialog', { name: 'Join group?' });
  await joinUnnamed.getByText('Bob invited you to a group.').waitFor();
  await joinUnnamed.getByRole('button', { name: 'Join group' }).click();
  await page.getByRole('heading', { name: 'Group: Group with Bob' }).waitFor({ timeout: 30_000 });

  step('the Groups screen lists the groups by name');
  await nav(page, 'Groups').click();
  const groups = page.getByRole('list', { name: 'Groups' });
  await groups.getByRole('link', { name: /^Open group Band practice/ }).waitFor();
  await groups.getByRole('link', { name: /^Open group Trip to the lake/ }).waitFor();
  await shot(page, '10-groups-list');
});
