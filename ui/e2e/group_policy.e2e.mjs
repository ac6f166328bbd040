// End-to-end: the groups screen's delivery policy, in headless Chromium against the UI served by
// a real `switchboard ui` runtime (alice, loop limit 1). Driven by tests/tests/ui_group_policy_e2e.rs,
// which plays bob and alice's agent session: a line `REQ <json>` on stdout gets one line
// `RES <json>` on stdin.
//
// Environment: UI_URL (the single-use sign-in link), SHOT_DIR (screenshots), CHROMIUM.

import { assert, driver, env, nav, newGroupInvite, scenario, shot, step } from './harness.mjs';

const UI_URL = env('UI_URL');

/** The runtime's view of the group, through the page's own cookie session. */
async function groupState(page, group) {
  return page.evaluate(async (g) => {
    const r = await fetch('/v1/rpc', { method: 'POST', body: '{"op":"group_list"}', headers: { 'content-type': 'application/json' } });
    return (await r.json()).find((x) => x.group === g);
  }, group);
}

await scenario(async ({ page }) => {
  step('a group made in the window, bob joins it');
  await page.goto(UI_URL);
  const link = await newGroupInvite(page);
  const group = await driver({ op: 'bob_join', link });
  await nav(page, 'Review').click();
  await nav(page, 'Groups').click();
  const card = () => page.getByRole('region', { name: group });
  await card().getByRole('cell', { name: /Bob's agent/ }).waitFor();

  step('the mode switch: agent messages to this group are held for review');
  const mode = () => card().getByLabel('Agent messages to this group');
  assert((await mode().inputValue()) === 'default', 'a new group follows the review policy');
  await mode().selectOption('review');
  await page.waitForFunction(async (g) => {
    const r = await fetch('/v1/rpc', { method: 'POST', body: '{"op":"group_list"}', headers: { 'content-type': 'application/json' } });
    return (await r.json()).find((x) => x.group === g)?.mode === 'review';
  }, group);
  await nav(page, 'Review').click();
  await nav(page, 'Groups').click();
  assert((await mode().inputValue()) === 'review', 'the switch shows the saved mode');
  await shot(page, '01-review-mode');

  step('bob talks past the loop limit: the group shows it is paused, resume releases it');
  await driver({ op: 'bob_say', group, text: 'one' });
  await driver({ op: 'bob_say', group, text: 'two' });
  const banner = () => card().getByText(/Paused by the loop guard/);
  // The banner shows once the hops reach the limit ("one"); "two", past it, is then held. Each
  // message reaches alice's runtime on its own, so wait for the count rather than the banner.
  const heldShown = async () => (await banner().count()) > 0 && (await banner().textContent()).includes('1 held');
  for (let i = 0; i < 100 && !(await heldShown()); i++) {
    await page.waitForTimeout(200);
    await nav(page, 'Review').click();
    await nav(page, 'Groups').click();
    await page.getByRole('heading', { name: 'Groups' }).waitFor();
  }
  await banner().waitFor();
  assert((await banner().textContent()).includes('1 held'), `the held message is counted: ${await banner().textContent()}`);
  await shot(page, '02-loop-guard-paused');
  await card().getByRole('button', { name: 'Resume this group' }).click();
  await page.waitForFunction(() => !document.body.textContent.includes('Paused by the loop guard'));
  const after = await groupState(page, group);
  assert(after.loop_guard.paused === false && after.loop_guard.hops === 0, `resumed: ${JSON.stringify(after)}`);

  step("alice's agent sends to the group: held, shown with its group, approved, bob gets it");
  const held = await driver({ op: 'alice_agent_send', group, text: 'may I share the plan?' });
  assert(held.state === 'held_for_review', `held: ${JSON.stringify(held)}`);
  await nav(page, 'Review').click();
  await page.getByText(`→ group ${group.slice(0, 8)}`).waitFor();
  await page.getByText('may I share the plan?').waitFor();
  await shot(page, '03-review-group-item');
  await page.getByRole('button', { name: /^Approve and send/ }).click();
  await page.getByText('Nothing is waiting for review.').waitFor();
  const got = await driver({ op: 'bob_wait_for', group, text: 'may I share the plan?' });
  assert(got.content === 'may I share the plan?', `bob got it: ${JSON.stringify(got)}`);

});
