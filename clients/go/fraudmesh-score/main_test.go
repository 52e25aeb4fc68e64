package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fraudv1 "github.com/fraudmesh/fraudmesh/gen/go/fraud/v1"
)

// required are the flags every valid invocation needs, plus a fixed transaction id.
var required = []string{"-transaction-id", "tx-1", "-card-id", "card-1", "-merchant-id", "m-1", "-amount-minor", "1299"}

func with(extra ...string) []string {
	return append(append([]string{}, required...), extra...)
}

func TestDefaults(t *testing.T) {
	opts, err := parseFlags(required, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseFlags: %v", err)
	}
	if opts.addr != "127.0.0.1:8080" || opts.timeout != 42*time.Millisecond || opts.currency != "EUR" || opts.json {
		t.Errorf("defaults = %+v", opts)
	}
}

func TestRequest(t *testing.T) {
	now := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	for _, tc := range []struct {
		name string
		args []string
		want *fraudv1.ScoreRequest
	}{
		{
			name: "minimal",
			args: required,
			want: &fraudv1.ScoreRequest{
				TransactionId: "tx-1", CardId: "card-1", MerchantId: "m-1",
				AmountMinor: 1299, Currency: "EUR", Timestamp: timestamppb.New(now),
			},
		},
		{
			name: "everything",
			args: with("-currency", "JPY", "-channel", "card-not-present", "-terminal-id", "t-9",
				"-time", "2026-03-01T08:00:00+01:00"),
			want: &fraudv1.ScoreRequest{
				TransactionId: "tx-1", CardId: "card-1", MerchantId: "m-1", TerminalId: "t-9",
				AmountMinor: 1299, Currency: "JPY",
				Timestamp: timestamppb.New(time.Date(2026, 3, 1, 7, 0, 0, 0, time.UTC)),
				Channel:   fraudv1.Channel_CHANNEL_CARD_NOT_PRESENT,
			},
		},
		{
			name: "card present",
			args: with("-channel", "card-present"),
			want: &fraudv1.ScoreRequest{
				TransactionId: "tx-1", CardId: "card-1", MerchantId: "m-1",
				AmountMinor: 1299, Currency: "EUR", Timestamp: timestamppb.New(now),
				Channel: fraudv1.Channel_CHANNEL_CARD_PRESENT,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := parseFlags(tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatalf("parseFlags: %v", err)
			}
			if got := opts.request(now); !proto.Equal(got, tc.want) {
				t.Errorf("request =\n %v\nwant\n %v", got, tc.want)
			}
		})
	}
}

func TestZeroAmountIsAnAccountVerification(t *testing.T) {
	opts, err := parseFlags([]string{"-card-id", "c", "-merchant-id", "m", "-amount-minor", "0"}, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseFlags: %v", err)
	}
	if got := opts.request(time.Now()).GetAmountMinor(); got != 0 {
		t.Errorf("amount = %d, want 0", got)
	}
}

func TestGeneratedTransactionID(t *testing.T) {
	opts, err := parseFlags([]string{"-card-id", "c", "-merchant-id", "m", "-amount-minor", "1"}, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseFlags: %v", err)
	}
	now := time.Now()
	first, second := opts.request(now).GetTransactionId(), opts.request(now).GetTransactionId()
	if !strings.HasPrefix(first, "cli-") || len(first) > maxIDLength {
		t.Errorf("generated id %q: want a cli- prefix and at most %d characters", first, maxIDLength)
	}
	if first == second {
		t.Errorf("two requests got the same generated id %q", first)
	}
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "-card-id is required; -merchant-id is required; -amount-minor is required"},
		{"empty card", with("-card-id", ""), "-card-id is required"},
		{"negative amount", with("-amount-minor", "-5"), "-amount-minor must not be negative"},
		{"amount not a number", with("-amount-minor", "12.99"), "invalid value"},
		{"lower-case currency", with("-currency", "eur"), `-currency "eur" is not a three-letter ISO 4217 code`},
		{"long currency", with("-currency", "EURO"), "is not a three-letter ISO 4217 code"},
		{"unknown channel", with("-channel", "online"), `-channel "online" is not card-present or card-not-present`},
		{"zero timeout", with("-timeout", "0s"), "-timeout must be positive"},
		{"timeout without unit", with("-timeout", "42"), "invalid value"},
		{"empty address", with("-addr", ""), "-addr must not be empty"},
		{"long id", with("-card-id", strings.Repeat("c", maxIDLength+1)), "-card-id is longer than 128 characters"},
		{"bad time", with("-time", "yesterday"), `-time "yesterday" is not an RFC 3339 time`},
		{"positional argument", with("extra"), `unexpected argument "extra"`},
		{"unknown flag", with("-verbose"), "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseFlags error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestRunExitCodesWithoutNetwork(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if got := run(context.Background(), with("-amount-minor", "-1"), &stdout, &stderr); got != exitUsage {
		t.Errorf("bad flags: exit %d, want %d", got, exitUsage)
	}
	if !strings.Contains(stderr.String(), "-amount-minor must not be negative") {
		t.Errorf("bad flags: stderr = %q", stderr.String())
	}
	stderr.Reset()
	if got := run(context.Background(), with("-amount-minor", "x"), &stdout, &stderr); got != exitUsage {
		t.Errorf("unparsable flag: exit %d, want %d", got, exitUsage)
	}
	if n := strings.Count(stderr.String(), `invalid value "x"`); n != 1 {
		t.Errorf("unparsable flag reported %d times, want once:\n%s", n, stderr.String())
	}
	stderr.Reset()
	if got := run(context.Background(), []string{"-h"}, &stdout, &stderr); got != exitOK {
		t.Errorf("-h: exit %d, want %d", got, exitOK)
	}
	if !strings.Contains(stderr.String(), "-transaction-id") {
		t.Errorf("-h: usage missing from stderr %q", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing", stdout.String())
	}
}

func TestPrintErrorShowsFieldViolations(t *testing.T) {
	st, err := status.New(codes.InvalidArgument, "amount_minor: must be positive").WithDetails(
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "amount_minor", Description: "must be positive"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printError(&out, st.Err())
	want := "fraudmesh-score: INVALID_ARGUMENT: amount_minor: must be positive\n" +
		"  field amount_minor: must be positive\n"
	if out.String() != want {
		t.Errorf("printError =\n%q\nwant\n%q", out.String(), want)
	}
}

func TestOneLineJSON(t *testing.T) {
	out, err := oneLineJSON(&fraudv1.ScoreResponse{TransactionId: "tx-1", Decision: fraudv1.Decision_DECISION_DECLINE, Score: 0.97})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"transactionId":"tx-1","decision":"DECISION_DECLINE","score":0.97,"reasons":[],` +
		`"modelVersion":"","scoredBy":"SCORED_BY_UNSPECIFIED","featureSource":"FEATURE_SOURCE_UNSPECIFIED","elapsedMs":0}`
	if string(out) != want {
		t.Errorf("oneLineJSON =\n%s\nwant\n%s", out, want)
	}
}

func TestPrintSummary(t *testing.T) {
	var out bytes.Buffer
	printSummary(&out, &fraudv1.ScoreResponse{
		TransactionId: "tx-1", Decision: fraudv1.Decision_DECISION_REVIEW, Score: 0.4312,
		Reasons: []string{"amount far above card average", "new merchant"}, ModelVersion: "v7",
		ScoredBy: fraudv1.ScoredBy_SCORED_BY_MODEL, FeatureSource: fraudv1.FeatureSource_FEATURE_SOURCE_PARTIAL,
		ElapsedMs: 3.25,
	}, 4100*time.Microsecond)
	for _, line := range []string{
		"decision     REVIEW\n",
		"score        0.4312\n",
		"reasons      amount far above card average; new merchant\n",
		"scored by    model\n",
		"features     partial\n",
		"elapsed      3.25 ms in the gateway, 4.10 ms round trip\n",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("summary lacks %q:\n%s", line, out.String())
		}
	}
}
