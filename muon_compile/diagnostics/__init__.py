"""What the backend did and why: the explanation, the decision counters, launches per step and
where Dynamo split a step."""
