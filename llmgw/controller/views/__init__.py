"""Views of the facts: each follows the change log (`follow.Follower`) and keeps
its own cache, from which node rows, the summary, report replies and the
gateways' endpoint feed are answered."""
