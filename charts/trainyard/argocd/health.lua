-- Argo CD health check for trainyard.dev/TrainingJob (docs/install.md, "Argo CD").
--
-- Argo CD runs it with gopher-lua (Lua 5.1) and gives a script from argocd-cm only the base,
-- table, package and a reduced os library: no string or math functions, and no method calls
-- on strings. This script uses none of them. `obj` is the TrainingJob as the API server
-- serves it; the health follows `status.phase` and `status.conditions` as the operator
-- writes them (docs/trainingjob.md, "Status").

-- The condition of this type, or nil.
local function condition(status, type_)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

-- The condition of this type if its status is "True", or nil.
local function true_condition(status, type_)
  local c = condition(status, type_)
  if c ~= nil and c.status == "True" then
    return c
  end
  return nil
end

-- A condition's message, or `fallback` when it has none.
local function message_of(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

-- "Reason: message", for the conditions that say what went wrong.
local function reason_and_message(c)
  local message = message_of(c, "")
  if c.reason == nil or c.reason == "" then
    return message_of(c, c.type)
  end
  if message == "" then
    return c.reason
  end
  return c.reason .. ": " .. message
end

-- A running attempt, with the step its trainers report (only trainers that report have one),
-- and the progress channel when it is down (the job trains on, but no hang can be judged).
local function running_message(status)
  local message = message_of(true_condition(status, "Running"), "every worker runs")
  local progress = status.progress
  if progress ~= nil and progress.attempt == status.attempt and progress.step ~= nil then
    message = message .. "; step " .. progress.step
    if progress.checkpointStep ~= nil then
      message = message .. ", checkpoint at step " .. progress.checkpointStep
    end
  end
  local channel = condition(status, "ProgressChannel")
  if channel ~= nil and channel.status == "False" then
    message = message .. "; " .. reason_and_message(channel)
  end
  return message
end

-- Pending: why no node takes the workers, or the first worker that waits for something.
local function pending_message(status)
  local unschedulable = true_condition(status, "Unschedulable")
  if unschedulable ~= nil then
    return reason_and_message(unschedulable)
  end
  local message = "attempt " .. (status.attempt or 0) .. ": waiting for the workers to run"
  if status.workers ~= nil then
    for _, w in ipairs(status.workers) do
      if w.phase ~= "Running" and w.reason ~= nil and w.reason ~= "" then
        return message .. "; worker " .. w.rank .. ": " .. w.reason
      end
    end
  end
  return message
end

-- What needs the user before the job can go on, or nil.
local function blocked(status)
  for _, type_ in ipairs({ "WriteRejected", "NameConflict" }) do
    local c = true_condition(status, type_)
    if c ~= nil then
      return reason_and_message(c)
    end
  end
  return nil
end

local function health(obj)
  local status = obj.status
  if status == nil or (status.phase == nil and status.conditions == nil) then
    return "Progressing", "Waiting for the operator"
  end
  local phase = status.phase
  -- Final phases first: the operator leaves a finished job as it ended.
  if phase == "Succeeded" then
    return "Healthy", message_of(true_condition(status, "Succeeded"), "every trainer exited 0")
  end
  if phase == "Failed" then
    local failed = true_condition(status, "Failed")
    if failed == nil then
      return "Degraded", "the job failed"
    end
    return "Degraded", reason_and_message(failed)
  end
  -- Before the generation check: an object that does not parse gets this condition alone.
  local invalid = true_condition(status, "InvalidSpec")
  if invalid ~= nil then
    return "Degraded", reason_and_message(invalid)
  end
  local generation = obj.metadata and obj.metadata.generation
  if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
    return "Progressing", "Waiting for the operator to observe generation " .. generation
  end
  local stuck = blocked(status)
  if stuck ~= nil then
    return "Degraded", stuck
  end
  if phase == nil then
    return "Progressing", "Waiting for the operator"
  end
  if phase == "Suspended" then
    -- The operator says why in the Running condition (False, reason Suspended).
    return "Suspended", message_of(condition(status, "Running"), "spec.suspend is true")
  end
  if phase == "Running" then
    return "Healthy", running_message(status)
  end
  if phase == "Restarting" then
    return "Progressing", message_of(true_condition(status, "Restarting"), "a gang restart is under way")
  end
  if phase == "Pending" then
    return "Progressing", pending_message(status)
  end
  return "Unknown", "unknown phase " .. phase
end

local hs = {}
hs.status, hs.message = health(obj)
return hs
