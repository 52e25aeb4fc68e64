package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	fraudv1 "github.com/fraudmesh/fraudmesh/gen/go/fraud/v1"
)

// flakyScoring fails the first `failures` attempts with `code` (with a pushback trailer
// when `pushback` is set), then answers; it stamps each attempt's arrival.
type flakyScoring struct {
	fraudv1.UnimplementedFraudScoringServer
	failures int32
	code     codes.Code
	pushback string
	attempts atomic.Int32
	mu       sync.Mutex
	arrivals []time.Time
}

func (s *flakyScoring) Score(ctx context.Context, req *fraudv1.ScoreRequest) (*fraudv1.ScoreResponse, error) {
	s.mu.Lock()
	s.arrivals = append(s.arrivals, time.Now())
	s.mu.Unlock()
	if s.attempts.Add(1) <= s.failures {
		if s.pushback != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(pushbackHeader, s.pushback))
		}
		return nil, status.Error(s.code, "try again")
	}
	return &fraudv1.ScoreResponse{TransactionId: req.GetTransactionId(), Decision: fraudv1.Decision_DECISION_APPROVE}, nil
}

func serveFlaky(t *testing.T, s *flakyScoring) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer()
	fraudv1.RegisterFraudScoringServer(server, s)
	go func() { _ = server.Serve(lis) }()
	t.Cleanup(server.Stop)
	return lis.Addr().String()
}

func TestUnavailableIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int32
		code     codes.Code
		exit     int
		attempts int32
	}{
		{"two unavailable, then an answer", 2, codes.Unavailable, exitOK, 3},
		{"unavailable three times", 3, codes.Unavailable, exitRPCError, 3},
		{"shed calls are not retried", 1, codes.ResourceExhausted, exitRPCError, 1},
		{"late calls are not retried", 1, codes.DeadlineExceeded, exitRPCError, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server := &flakyScoring{failures: tc.failures, code: tc.code}
			addr := serveFlaky(t, server)
			var stdout, stderr bytes.Buffer
			got := run(context.Background(), with("-addr", addr, "-timeout", "5s"), &stdout, &stderr)
			if got != tc.exit {
				t.Fatalf("exit %d, want %d (stderr %s)", got, tc.exit, stderr.String())
			}
			if n := server.attempts.Load(); n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
			if tc.exit == exitOK && !strings.Contains(stdout.String(), "decision     APPROVE") {
				t.Errorf("stdout = %q", stdout.String())
			}
		})
	}
}

func TestPushbackIsHonoured(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pushback string
		timeout  string
		exit     int
		attempts int32
	}{
		{"a refusal that says when is sent again after that long", "150", "5s", exitOK, 2},
		{"a pushback past the deadline is not waited for", "150", "100ms", exitRPCError, 1},
		{"a negative pushback means do not retry", "-1", "5s", exitRPCError, 1},
		{"a malformed pushback means do not retry", "soon", "5s", exitRPCError, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server := &flakyScoring{failures: 1, code: codes.ResourceExhausted, pushback: tc.pushback}
			addr := serveFlaky(t, server)
			var stdout, stderr bytes.Buffer
			got := run(context.Background(), with("-addr", addr, "-timeout", tc.timeout), &stdout, &stderr)
			if got != tc.exit {
				t.Fatalf("exit %d, want %d (stderr %s)", got, tc.exit, stderr.String())
			}
			if n := server.attempts.Load(); n != tc.attempts {
				t.Fatalf("%d attempts, want %d", n, tc.attempts)
			}
			if tc.attempts == 2 {
				if gap := server.arrivals[1].Sub(server.arrivals[0]); gap < 150*time.Millisecond {
					t.Errorf("sent again after %v, before the 150 ms the server asked for", gap)
				}
			}
		})
	}
}
